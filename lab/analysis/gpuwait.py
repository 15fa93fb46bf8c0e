"""Who made the GPUs wait: a collective phase's GPU idle time split into causes, each with
its evidence in numbers and the fix it suggests, from the phase's measurements alone.

The article's advice is to look at the job's timings, the links, the loader and the
placement *together*. What is read, per phase:

- the step's parts of each step's last rank to finish computing (``critical_share``): in a
  ring an early rank's all-reduce holds the later ranks' waits, the last rank's does not, so
  its parts say what held the step;
- the loader's own record per worker: time fetching a batch from storage against time
  preprocessing it, which splits a data wait into "storage too slow" and "CPU too slow";
- the loader flows' bytes against the rate of their storage host's link on the network
  they used (the fabric or a storage network of its own, read from their addresses), the
  job's all-reduce time against the ideal for its bottleneck rate, drops and retransmits;
- where the job's all-reduce runs on RoCE over a fabric with PFC, the switches' pause
  counters: which ports PFC paused on the job's paths, for how long, and where the pauses
  started (``lab.analysis.pauses``).

Whose traffic a flow is comes from its two ends and the scheduler's map of hosts to jobs
and storage (``phase_details.<phase>.scheduler``, which the lab exports as a scheduler
would): never from a tag the lab put on the flow, which an operator does not have.
Never the phase's name, the scenario's settings or its description: a test runs this on
results with every phase renamed, the parameters removed and the flows' tags and names
gone, and must get the same causes. Pure functions over result.json.
"""

from __future__ import annotations

import collections
import copy
import itertools
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lab.analysis import pauses
from lab.model.flowpaths import attachment

#: A cause is named when it holds the GPUs for at least this share of step time. A healthy
#: phase stays far below (gpu-wait: data wait 0.04 %, the all-reduce beyond its ideal under
#: 3 %), but with another job running beside it on links of its own, the emulator's shared
#: CPU and datapath cost the job's all-reduce up to 11 % of its step (job-aware, one run of
#: four); every injected cause held 29 % or more. The line sits between the two.
NAMED_MIN_SHARE = 0.15

#: What each cause suggests, in the operator's words.
FIXES = {
    "placement": "place the job's ranks in as few racks as it fits in, in ring order "
                 "(a topology-aware scheduler): its all-reduce then crosses no slower "
                 "shared layer it does not need",
    "data": "feed the loaders faster: a faster or separate storage network, more storage "
            "hosts, or caching the dataset nearer the GPUs",
    "cpu": "more loader workers, lighter or offloaded preprocessing, or more CPU per GPU",
    "interface": "bind the collective to the fabric's NIC (NCCL_SOCKET_IFNAME / "
                 "GLOO_SOCKET_IFNAME), not the management network's",
    "other-job": "keep the jobs' flows on disjoint uplinks (a job-aware policy, e.g. "
                 "--policy job-aware), or place the jobs in racks that share no uplink",
    "network": "spread the job's flows (another hash policy, pinned paths) or give the "
               "job's links the capacity its all-reduce needs",
    "straggler": "find the slow rank: its step is longer than the others' before the "
                 "all-reduce",
    "pause": "keep the congested port's queue below XOFF: ECN marking there with DCQCN at "
             "the senders; or carry the traffic that congests it in another priority than "
             "the job's, or move its receiver off the switch the job's paths cross",
}


#: Whose traffic a flow is, from its ends and the scheduler's map: between two hosts of the
#: job diagnosed; between the job and a storage host (its batches, reads, checkpoints);
#: between two hosts of one other job; anything else (hosts no job was given).
JOB, JOB_DATA, OTHER_JOB, NO_JOB = "job", "job data", "other job", "no job"


@dataclass(frozen=True)
class Scheduler:
    """The scheduler's map for a phase: the job diagnosed, every other job's hosts, and
    the storage hosts. Empty where a result has none: then no flow is the job's."""

    job: frozenset[str]
    others: dict[str, str]          # host -> the other job it runs
    storage: frozenset[str]

    @classmethod
    def of(cls, details: dict[str, Any]) -> Scheduler:
        s = details.get("scheduler") or {}
        jobs = s.get("jobs") or {}
        return cls(frozenset(jobs.get(s.get("job"), ())),
                   {h: j for j, hosts in jobs.items() if j != s.get("job") for h in hosts},
                   frozenset(s.get("storage") or ()))

    def whose(self, flow: dict[str, Any]) -> str:
        a, b = flow["src"], flow["dst"]
        if a in self.job and b in self.job:
            return JOB
        if (a in self.storage and b in self.job) or (a in self.job and b in self.storage):
            return JOB_DATA
        if a in self.others and self.others[a] == self.others.get(b):
            return OTHER_JOB
        return NO_JOB


def job_flows(details: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's own connections (its all-reduce): flows between two of its hosts."""
    sched = Scheduler.of(details)
    return [f for f in details.get("flows", []) if sched.whose(f) == JOB]


def data_flows(details: dict[str, Any]) -> list[dict[str, Any]]:
    """What the storage hosts sent the job: its batches (and reads)."""
    sched = Scheduler.of(details)
    return [f for f in details.get("flows", [])
            if sched.whose(f) == JOB_DATA and f["src"] in sched.storage]


#: A rank whose mean compute is this much longer than the fastest rank's is a straggler,
#: and the others' wait for its compute is its doing; below it, compute is the same model
#: on every rank (measured spread 1.00-1.02) and a lag is a late batch's or jitter's.
STRAGGLER_SPREAD = 1.2


def compute_spread(details: dict[str, Any]) -> float:
    """The slowest rank's mean compute over the fastest's, over measured steps (1.0 when
    there is nothing to compare)."""
    means = []
    for rk in details.get("gpu_wait", {}).get("ranks", []):
        rows = [s["compute_s"] for s in rk.get("steps", []) if not s.get("warmup")]
        if rows:
            means.append(sum(rows) / len(rows))
    return max(means) / min(means) if means and min(means) > 0 else 1.0


def _loader_split(details: dict[str, Any]) -> tuple[float, float, int, int]:
    """(seconds fetching, seconds preprocessing, batches, workers) over every rank's loader."""
    fetch = prep = 0.0
    batches = workers = 0
    for rk in details.get("gpu_wait", {}).get("ranks", []):
        for w in (rk.get("loader") or {}).get("per_worker") or []:
            fetch += w.get("fetch_s") or 0.0
            prep += w.get("prep_wall_s") or 0.0
            batches += w.get("batches") or 0
            workers += 1
    return fetch, prep, batches, workers


def carried_bytes(flow: dict[str, Any]) -> int:
    """What a flow carried: its switches' count on the fabric; off it (the management LAN,
    whose bridge counts no flow) its ends' own count (TCP's bytes acked or received)."""
    if flow.get("interface", "fabric") == "fabric":
        return flow.get("bytes") or 0
    return max(flow.get("sent_bytes") or 0, flow.get("received_bytes") or 0)


def port_rates(topology: dict[str, Any]) -> dict[tuple[str, str], float]:
    """Each link's rate (Mbit/s) as the fabric was built, both ways, fabric and management
    networks: what an operator knows of a port without the lab's settings. Read where a
    link's record carries no rate of its own (a stripped result)."""
    out: dict[tuple[str, str], float] = {}
    for ln in [*topology.get("links", []), *(topology.get("mgmt") or {}).get("links", [])]:
        out[(ln["a"], ln["b"])] = out[(ln["b"], ln["a"])] = ln["bw_mbps"]
    return out


def _rate(ln: dict[str, Any], rates: dict[tuple[str, str], float]) -> float | None:
    """A link record's rate in force, else its rate as built."""
    return ln.get("bw_mbps") or rates.get((ln.get("node"), ln.get("peer")))


def _util(ln: dict[str, Any], rates: dict[tuple[str, str], float], dur: float) -> float | None:
    """A link record's mean utilisation, else its bytes over the phase at its rate as built."""
    if ln.get("util_mean") is not None:
        return ln["util_mean"]
    bw = _rate(ln, rates)
    return round(ln["tx_bytes"] * 8 / (bw * 1e6 * dur), 4) if bw and dur and \
        ln.get("tx_bytes") is not None else None


def storage_links(details: dict[str, Any],
                  topology: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Each storage host that sent the loaders data: its loader bytes over the phase against
    the rate of its own link in the phase, as a utilisation over the phase, on the network
    those flows used (their ``interface``, read from their addresses: the fabric, or a
    storage network of its own); with the switch port of that link and its drops. The rate
    is the link record's, else (a stripped result) the port's as built (``port_rates``).

    The host's own egress, where its batches queue, is not a switch port: its bytes are
    the flows'. Off the fabric those are TCP's payload, a few per cent under the wire's."""
    rates = port_rates(topology or {})
    ports = {(ln.get("role", "fabric"), ln["peer"]): ln for ln in details.get("links", [])}
    sent: dict[str, int] = {}
    network: dict[str, str] = {}
    for f in data_flows(details):
        sent[f["src"]] = sent.get(f["src"], 0) + carried_bytes(f)
        network[f["src"]] = f.get("interface", "fabric")
    dur = details.get("duration_s") or 0.0
    out = []
    for host, nbytes in sorted(sent.items()):
        ln = ports.get((network[host], host)) or {}
        bw = _rate(ln, rates) if ln else None
        util = nbytes * 8 / (bw * 1e6 * dur) if bw and dur else None
        out.append({"host": host, "network": network[host], "port": ln.get("intf"),
                    "bytes": nbytes, "bw_mbps": bw,
                    "util": round(util, 3) if util is not None else None,
                    "drops": ln.get("drops")})
    return out


def _job_hosts(details: dict[str, Any]) -> list[str]:
    """The hosts the job's all-reduce connections leave from: its ranks' placement."""
    return sorted({f["src"] for f in job_flows(details)})


def rack_uplinks(topology: dict[str, Any]) -> set[tuple[str, str]]:
    """The links leaving a rack, upwards: (a switch hosts hang from, as a leaf or a
    fat-tree's edge, a switch they do not, as a spine or an aggregation switch)."""
    switches = {sw["name"] for sw in topology.get("switches", [])}
    access = set(attachment(topology).values())
    out = set()
    for ln in topology.get("links", []):
        a, b = ln["a"], ln["b"]
        if a in switches and b in switches and (a in access) != (b in access):
            out.add((a, b) if a in access else (b, a))
    return out


def most_free_in_a_rack(topology: dict[str, Any], storage: set[str]) -> int:
    """The most hosts free of storage that hang from one rack: the largest job that can be
    placed in one."""
    per_rack = collections.Counter(sw for h, sw in attachment(topology).items()
                                   if h not in storage)
    return max(per_rack.values(), default=0)


def host_link_rates(topology: dict[str, Any], hosts: Iterable[str]) -> list[float]:
    """The rates (Mbit/s) of ``hosts``' own links to their racks."""
    att, wanted = attachment(topology), set(hosts)
    return [ln["bw_mbps"] for ln in topology.get("links", [])
            for h, sw in ((ln["a"], ln["b"]), (ln["b"], ln["a"]))
            if h in wanted and att.get(h) == sw]


def uplink_rates(topology: dict[str, Any]) -> list[float]:
    """The rates (Mbit/s) of the racks' uplinks (``rack_uplinks``)."""
    up = rack_uplinks(topology)
    return [ln["bw_mbps"] for ln in topology.get("links", [])
            if (ln["a"], ln["b"]) in up or (ln["b"], ln["a"]) in up]


def best_bottleneck_bps(topology: dict[str, Any], details: dict[str, Any]) -> float | None:
    """The slowest link a ring of the job's size would cross if placed as well as this
    fabric allows: inside one rack when some rack has that many hosts free of storage (its
    hosts' own links), else out of its rack (the slower of host and rack-uplink links).
    Racks are the switches hosts hang from, so a leaf-spine and a fat-tree read alike.
    None when the phase has no all-reduce to place."""
    hosts = _job_hosts(details)
    if not hosts:
        return None
    storage = set(Scheduler.of(details).storage)
    host_bw = host_link_rates(topology, hosts)
    fabric_bw = uplink_rates(topology)
    if not host_bw:
        return None
    best = min(host_bw)
    if len(hosts) > most_free_in_a_rack(topology, storage) and fabric_bw:
        best = min(best, min(fabric_bw))
    return best * 1e6


def shared_links(details: dict[str, Any],
                 topology: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The links the job's all-reduce crossed (data direction), each with the bytes sent
    over it by whose traffic (``Scheduler.whose``: the job's own, its data, another job's,
    no job's), most shared first.

    A flow's bytes on the link from switch s are the bytes s counted for it (its
    ``hop_bytes``): what s forwarded onto that link."""
    links = {(ln["node"], ln["peer"]): ln for ln in details.get("links", [])}
    rates, dur = port_rates(topology or {}), details.get("duration_s") or 0.0
    sched = Scheduler.of(details)
    per: dict[tuple[str, str], dict[str, int]] = {}
    job: set[tuple[str, str]] = set()
    for f in details.get("flows", []):
        whose = sched.whose(f)
        hops = [*f.get("path", []), f["dst"]]
        for sw, nxt in itertools.pairwise(hops):
            key = (sw, nxt)
            if key not in links:
                continue
            sent = (f.get("hop_bytes") or {}).get(sw, 0)
            kinds = per.setdefault(key, {})
            kinds[whose] = kinds.get(whose, 0) + sent
            if whose == JOB:
                job.add(key)
    out = []
    for key in sorted(job):     # ties in one order, whatever the set's
        kinds = per[key]
        total = sum(kinds.values())
        other = total - kinds.get(JOB, 0)
        ln = links[key]
        out.append({"link": f"{key[0]}->{key[1]}", "util": _util(ln, rates, dur),
                    "drops": ln.get("drops", 0), "bytes": kinds,
                    "other_share": round(other / total, 3) if total else 0.0})
    # most shared where it mattered: another flow's share of a busy link first
    return sorted(out, key=lambda x: (-x["other_share"] * (x["util"] or 0), -x["other_share"]))


#: The all-reduce's whole excess is PFC's pauses' when they held the job's paths for at least
#: this share of the phase (the longest any port on them was paused over the phase's
#: duration: a ring waits for its slowest hop). The whole, not the seconds paused: between
#: pauses the flows share queues the pauses filled. In pfc-hol, PFC alone paused one NIC
#: 3.1 s of 6 (52 %) and cut the victim to 37-38 % of its rate; with DCQCN all ports
#: together paused 0.54-0.73 s (any one under 12 %) and the victim ran at 96-99 % of its
#: rate alone. The line sits between the two.
PAUSE_MIN_HELD = 0.15


def job_pauses(details: dict[str, Any], topology: dict[str, Any]) -> dict[str, Any] | None:
    """What PFC did to the job's RoCE flows in the phase (``lab.analysis.pauses.held``);
    None when PFC did not run or the job has no RoCE flow: then the diagnosis is what it
    is on any other fabric."""
    return pauses.held(details.get("pfc"), details.get("pfc_feeders") or {},
                       job_flows(details), topology, details.get("duration_s") or 0.0)


def off_fabric(details: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's all-reduce connections that did not use the fabric's interface (the
    address each connection used, as its switches and its ends saw it)."""
    return [f for f in job_flows(details) if f.get("interface", "fabric") != "fabric"]


def _off_fabric_text(flows: list[dict[str, Any]], details: dict[str, Any],
                     topology: dict[str, Any]) -> str:
    """Which network they used and what its links carried, as text."""
    if not flows:
        return ""
    nets = sorted({f["interface"] for f in flows})
    via = sorted({sw for f in flows for sw in f.get("path", [])})
    links = [ln for ln in details.get("links", []) if ln["node"] in via]
    carried = sum(ln["tx_bytes"] for ln in links)
    rates, dur = port_rates(topology), details.get("duration_s") or 0.0
    busiest = max(links, key=lambda ln: _util(ln, rates, dur) or 0, default=None)
    text = (f"{', '.join(nets)} network via {', '.join(via)}, from {flows[0]['src_ip']}; "
            f"its ports carried {carried / 1e6:.1f} MB")
    if busiest is not None and (bw := _rate(busiest, rates)):
        text += (f", {busiest['node']}->{busiest['peer']} at "
                 f"{_pct(_util(busiest, rates, dur) or 0)} of {bw:g} Mbit/s")
    return text


def _loader_evidence(gw: dict[str, Any], details: dict[str, Any],
                     links: list[dict[str, Any]]) -> dict[str, str]:
    """The data and cpu causes' evidence: the data wait, what the loaders spent their time
    on, the storage links' utilisation, the queue-empty steps."""
    crit = gw["critical_share"]
    fetch, prep, batches, workers = _loader_split(details)
    fetch_frac = fetch / (fetch + prep) if fetch + prep > 0 else 0.0
    per_batch = (lambda s: s / batches * 1000) if batches else (lambda s: 0.0)
    hot = [s for s in links if s["util"] is not None]
    empty = f"loader queue empty in {gw['queue_empty_steps']} of {gw['rank_steps']} steps"
    return {
        "data": (f"data wait {_pct(crit['data_wait'])} of the step; the loaders spent "
                 f"{_pct(fetch_frac)} of their time fetching ({per_batch(fetch):.0f} ms a "
                 "batch); storage links " + ", ".join(
                     f"{s['host']} at {_pct(s['util'])} of {s['bw_mbps']:g} Mbit/s "
                     f"({s['network']} network, {s['port']}: {s['drops']} drops)"
                     for s in hot) + f"; {empty}"),
        "cpu": (f"data wait {_pct(crit['data_wait'])} of the step; the loaders spent "
                f"{_pct(1 - fetch_frac)} of their time preprocessing ({per_batch(prep):.0f} "
                f"ms a batch, {workers} workers in all); {empty}")}


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def diagnose_phase(metrics: dict[str, Any], details: dict[str, Any],
                   topology: dict[str, Any]) -> dict[str, Any]:
    """One phase's GPU idle time, ranked by cause (see the module's docstring)."""
    gw = metrics["gpu_wait"]
    crit = gw["critical_share"]
    lag = gw.get("compute_lag_share", 0.0)
    fetch, prep, _, _ = _loader_split(details)
    fetch_frac = fetch / (fetch + prep) if fetch + prep > 0 else 0.0
    step = metrics.get("step_mean_s") or 0.0
    ideal = (metrics.get("ideal_comm_s") or 0.0) / step if step else 0.0
    # The ideal all-reduce scales with 1/bottleneck rate: placed as well as the fabric
    # allows, it would cross the best bottleneck; the rest of its ideal is the placement's.
    now_bps = metrics.get("bottleneck_bps") or 0.0
    best_bps = best_bottleneck_bps(topology, details)
    ideal_best = ideal * now_bps / best_bps if best_bps and now_bps else ideal
    placed = max(0.0, min(crit["exposed_comm"], ideal) - ideal_best)
    # On a NIC that is not the fabric's, the gap to the well-placed ideal is the interface's.
    wrong_nic = off_fabric(details)
    interface, placed = (placed, 0.0) if wrong_nic else (0.0, placed)
    # The last rank to compute waits at the barrier only for all-reduces still running
    # (the network's); the others' wait for its compute is the lag, a straggler's when one
    # rank computes longer than the others all along (not a late batch's or jitter's).
    spread = compute_spread(details)
    straggler = lag if spread > STRAGGLER_SPREAD else 0.0
    # The GPUs idle for the critical rank's waits, and the others for a straggler's lag too
    # (in no rank's own parts: the critical rank computed through it).
    idle = max(0.0, 1.0 - crit["compute"] + straggler)
    excess_comm = max(0.0, crit["exposed_comm"] + crit["barrier"] - ideal)
    shared = shared_links(details, topology)
    # The all-reduce beyond its ideal is the pauses' when PFC held the job's paths long
    # enough (PAUSE_MIN_HELD), else the network's; whose traffic it met says whether it
    # was another job's.
    paused = job_pauses(details, topology)
    by_pause = excess_comm if paused and paused["held_share"] >= PAUSE_MIN_HELD else 0.0
    rest = excess_comm - by_pause
    met = _dominant_other(shared[0]) if shared and shared[0]["other_share"] > 0 else None
    by_job = rest if met == OTHER_JOB else 0.0
    shares = {"data": crit["data_wait"] * fetch_frac,
              "cpu": crit["data_wait"] * (1.0 - fetch_frac),
              "placement": placed, "interface": interface,
              "network": rest - by_job, "other-job": by_job, "straggler": straggler,
              **({"pause": by_pause} if paused is not None else {})}
    hops = len(_job_hosts(details))
    uplinks = rack_uplinks(topology)
    crossed = sum(1 for sh in shared if tuple(sh["link"].split("->")) in uplinks)
    links = storage_links(details, topology)
    evidence = {
        **_loader_evidence(gw, details, links),
        "placement": (f"the ring's bottleneck is {now_bps / 1e6:g} Mbit/s where a placement "
                      f"of its {hops} ranks in one rack would give "
                      f"{(best_bps or now_bps) / 1e6:g} Mbit/s; its hops cross {crossed} rack "
                      f"uplinks; ideal all-reduce {_pct(ideal)} of the step against "
                      f"{_pct(ideal_best)} placed well"),
        "interface": (f"{len(wrong_nic)} of the job's all-reduce connections ran off the "
                      f"fabric ({_off_fabric_text(wrong_nic, details, topology)}); its "
                      f"bottleneck is "
                      f"{now_bps / 1e6:g} Mbit/s where the fabric's NICs give "
                      f"{(best_bps or now_bps) / 1e6:g} Mbit/s"),
        **_comm_evidence(metrics, ideal, shared),
        "pause": pauses.held_text(paused, details.get("duration_s") or 0.0),
        "straggler": (f"the other GPUs waited {_pct(lag)} of the step for the last rank "
                      f"to finish computing; the slowest rank's compute is {spread:.2f}x "
                      f"the fastest's"),
    }
    causes = sorted(({"cause": c, "share_of_step": round(v, 4),
                      "share_of_idle": round(v / idle, 4) if idle else 0.0,
                      "evidence": evidence[c], "fix": FIXES[c]}
                     for c, v in shares.items()), key=lambda x: -x["share_of_step"])
    named = [c["cause"] for c in causes if c["share_of_step"] >= NAMED_MIN_SHARE]
    return {"gpu_idle_share": round(idle, 4), "ideal_comm_share": round(ideal, 4),
            "placed_ideal_comm_share": round(ideal_best, 4),
            "named": named, "causes": causes, "storage_links": links,
            "shared_links": shared[:3], **({"pauses": paused} if paused is not None else {})}


def _comm_evidence(metrics: dict[str, Any], ideal: float,
                   shared: list[dict[str, Any]]) -> dict[str, str]:
    """The other-job and network causes' evidence: the all-reduce against its ideal, the
    drops and retransmits, and the most shared link the job crossed with whose traffic."""
    exposed = metrics["gpu_wait"]["critical_share"]["exposed_comm"]
    top = (f"{shared[0]['link']} carried {_pct(shared[0]['other_share'])} other traffic "
           f"({_other_kinds(shared[0])}) at {_pct(shared[0]['util'] or 0)}, "
           f"{shared[0]['drops']} drops" if shared else "")
    return {
        "other-job": f"all-reduce exposed {_pct(exposed)} of the step against {_pct(ideal)} "
                     f"ideal; {top}",
        "network": (f"all-reduce exposed {_pct(exposed)} of the step against {_pct(ideal)} "
                    f"ideal for its bottleneck; {metrics.get('drops', 0)} drops, "
                    f"{metrics.get('retransmits', 0)} retransmits"
                    + (f"; {top}" if shared and shared[0]["other_share"] > 0 else ""))}


def _dominant_other(link: dict[str, Any]) -> str | None:
    """Whose traffic besides the job's own carried most bytes on a link."""
    other = {k: v for k, v in link["bytes"].items() if k != JOB and v}
    return max(other, key=other.get) if other else None


def _other_kinds(link: dict[str, Any]) -> str:
    """Whose traffic besides the job's own was on a link, by bytes, as text."""
    other = {k: v for k, v in link["bytes"].items() if k != JOB and v}
    return ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in
                     sorted(other.items(), key=lambda kv: -kv[1]))


def diagnose(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every phase with the ranks' step parts: {phase: its diagnosis}."""
    phases = result.get("metrics", {}).get("phases", {})
    details = result.get("phase_details", {})
    topology = result.get("topology", {})
    return {name: diagnose_phase(m, details.get(name, {}), topology)
            for name, m in phases.items() if m.get("gpu_wait")}


def render(diagnosis: dict[str, dict[str, Any]]) -> list[str]:
    """The operator's view: per phase, the causes named, each with its evidence and fix."""
    lines = []
    for name, d in diagnosis.items():
        head = ", ".join(d["named"]) or "nothing beyond the all-reduce's own time"
        lines.append(f"{name}: GPU idle {_pct(d['gpu_idle_share'])} of the step "
                     f"(all-reduce's ideal {_pct(d['ideal_comm_share'])}); who made the GPUs "
                     f"wait: {head}")
        for c in d["causes"]:
            if c["cause"] in d["named"]:
                lines.append(f"  {c['cause']}: {_pct(c['share_of_step'])} of the step "
                             f"({_pct(c['share_of_idle'])} of idle) - {c['evidence']}")
                lines.append(f"    fix: {c['fix']}")
    return lines


# -- a result without its answers ---------------------------------------------------------

#: What a phase's metrics echo of its settings rather than measure (``other_job``: the
#: other job's hosts as configured, and its slowdown against a phase the scenario names).
SETTING_ECHOES = ("paths", "placement", "pins", "marking", "cc", "library", "program", "hosts",
                  "other_job", "transport", "spray")
#: What the lab wrote on each flow that a flow record (the 5-tuple, its bytes, its path)
#: does not have: the name it gave the flow, the role it started it for (``kind``), the
#: rank and epoch it belongs to, its configured rate and congestion control, and the name
#: of the QP a sprayed 5-tuple belongs to. The stripped flows are named by their place in
#: the list.
FLOW_LABELS = ("id", "kind", "rank", "epoch", "offered_bps", "cc", "subflow_of")
#: What a loader's record echoes of its settings (its per-worker record is what it measured).
LOADER_SETTINGS = ("workers", "prefetch", "batch_bytes", "cpu_ms")
#: What a phase's link record holds of the rate the scenario set on it (a slowed storage
#: link's rate is the cause to be found): the rate, and the utilisations made from it.
#: What is left is what the port counted; its rate as built is the topology's.
LINK_SETTINGS = ("bw_mbps", "util_mean", "util_max")


def stripped(result: dict[str, Any]) -> dict[str, Any]:
    """The result as an operator without the scenario would have it, the diagnosis's input
    contract and the who-waited exercise's: ``{"result": ..., "alias": {phase: "pN"}}``.

    Kept: the topology, the machine, and per phase its metrics and details under a new name,
    in a shuffled order seeded by the run's own measurements (so neither the order nor the
    names can be learnt from another run), with the scheduler's map of hosts to jobs.
    Gone: the scenario's name, description and parameters, the lab's diagnosis, everything
    keyed or ordered by the phase names (the run's timings, its first phase, the whole-run
    sections), the settings a phase's metrics echo, the settings in each loader's record
    the rate each link was set to in the phase, and the lab's labels on each flow."""
    names = list(result["metrics"]["phases"])
    order = sorted(names)
    random.Random(json.dumps(result["metrics"]["phases"], sort_keys=True)).shuffle(order)
    alias = {n: f"p{i}" for i, n in enumerate(order)}
    phases = {alias[n]: {k: v for k, v in result["metrics"]["phases"][n].items()
                         if k not in SETTING_ECHOES} for n in order}
    details = {alias[n]: copy.deepcopy(result["phase_details"][n]) for n in order
               if n in result.get("phase_details", {})}
    for d in details.values():
        d["flows"] = [{"id": f"f{i}", **{k: v for k, v in f.items() if k not in FLOW_LABELS}}
                      for i, f in enumerate(d.get("flows", []))]
        for rank in d.get("gpu_wait", {}).get("ranks", []):
            for key in LOADER_SETTINGS:
                (rank.get("loader") or {}).pop(key, None)
        for ln in d.get("links", []):
            for key in LINK_SETTINGS:
                ln.pop(key, None)
    out = {k: copy.deepcopy(result[k]) for k in ("schema", "kind", "environment", "topology")
           if k in result}
    out["metrics"] = {"phases": copy.deepcopy(phases)}
    out["phase_details"] = details
    return {"result": out, "alias": alias}
