"""The live-streaming incident, phase by phase, on one running edge network.

Phases (``metrics.phases``, in this order):

* ``before-upgrade`` - the old uplinks (``before.uplink_bw``), half the media servers, the
  default L3 hash: every big stream from the origin to the main CDN node shares one uplink,
  and it fits.
* ``incident`` - uplinks upgraded (``topology.uplink_bw``), twice the servers, bigger
  streams, the same hash: the big streams still share one uplink, which now saturates,
  drops and stalls the viewers - while every interface and BGP session is up and the other
  uplinks idle.
* ``fix-hash`` - L4 hash (5-tuple) with a seed per router tier chosen by asking the
  kernel (``ip route get``) where each stream would go; different seeds per tier avoid
  polarisation (the same hash at two tiers sends all of a border's flows to one uplink).
* ``fix-placement`` - L3 hash as before, and a route controller pins each big stream to the
  least-loaded uplink by the rates measured in ``incident``.
* ``failover-link`` / ``failover-border`` - the ``fix-hash`` set-up with the busiest uplink,
  then a border router, cut silently mid-phase (BFD must notice) and restored later.

Mechanism lives in ``lab.net.edge`` (topology), ``lab.net.edgecontrol`` (hash, pinning, cuts),
``lab.measure.routerstats`` (router counters) and ``lab.agents.streamer`` (senders and players).
"""

from __future__ import annotations

import itertools
import json
import random
import shlex
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controllers.ecn import htb_burst_bytes
from lab import agents
from lab.analysis import diagnose
from lab.machine import programs
from lab.machine.progress import Ticker
from lab.measure import routerstats, telemetry
from lab.measure.window import Window
from lab.model.errors import MachineError, ScenarioError
from lab.model.flowpaths import adjacency, attachment, path_from_counters
from lab.model.flows import FIXED_SPORTS, FlowSpec
from lab.model.result import SCHEMA_VERSION
from lab.model.scenario import Param, require
from lab.net import edgecontrol, frr
from lab.net.edge import CORE, GATEWAY_IP
from lab.net.edgecontrol import FiveTuple

#: dccore's interface on the fabric (its port 0): where origin streams enter the routers.
CORE_FABRIC_INTF = f"{CORE}-eth0"
PHASES = ("before-upgrade", "incident", "fix-hash", "fix-placement", "failover-link",
          "failover-border")
PLAYER_PORT_BASE = 9000
#: A seed search stops at the first seed pair whose predicted hottest uplink stays below
#: this share of its rate.
SEED_TARGET_UTIL = 0.7
SEED_TRIES = 64
#: Phases after which every origin stream is traced with its own 5-tuple (scapy), routing
#: still as it was: the operator's confirmation of what the counters say.
PROBE_PHASES = ("incident", "fix-hash")

SCHEMA: dict[str, Param] = {
    "streams.proto": Param(str, choices=("tcp", "udp")),
    "streams.fps": Param(float, 1, 120),
    "streams.ingest_mbps": Param(float, 0.1, 50),
    "streams.normal_mbps": Param(float, 0.1, 50),
    "streams.big_mbps": Param(float, 0.1, 100),
    "streams.cc": Param(str, choices=("cubic", "reno", "bbr")),
    "before.uplink_bw": Param(float, 1, 1000),
    "before.servers": Param(int, 1, 32),
    "before.big_streams": Param(int, 1, 32),
    "before.big_mbps": Param(float, 0.1, 100),
    "after.servers": Param(int, 1, 32),
    "after.big_streams": Param(int, 1, 32),
    "after.normal_streams": Param(int, 0, 32),
    "failover.cut_at": Param(float, 0.5, 600),
    "failover.restore_at": Param(float, 1, 600),
    "phases": Param(str),
}


@dataclass
class Stream:
    """One live stream: who pushes it where, its 5-tuple and bitrate."""

    id: str
    phase: str
    role: str            # ingest | big | normal
    src: str
    dst: str
    src_ip: str
    dst_ip: str
    sport: int
    dport: int
    rate_mbps: float
    proto: str
    stream_id: int
    index: int           # global index: its OVS watch cookies
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def tuple(self) -> FiveTuple:
        return FiveTuple(self.src_ip, self.dst_ip, self.proto, self.sport, self.dport)

    def spec(self) -> FlowSpec:
        return FlowSpec(id=self.id, src=self.src, dst=self.dst, src_ip=self.src_ip,
                        dst_ip=self.dst_ip, proto=self.proto, sport=self.sport,
                        dport=self.dport, rate_bps=self.rate_mbps * 1e6, kind="stream")


def phase_names(params: dict[str, Any]) -> list[str]:
    wanted = str(params.get("phases", "all"))
    if wanted == "all":
        return list(PHASES)
    names = [p.strip() for p in wanted.split(",") if p.strip()]
    if not names:
        raise ScenarioError("phases", f"names no phase (give all, or some of: "
                            f"{', '.join(PHASES)})")
    for n in names:
        if n not in PHASES:
            raise ScenarioError("phases", f"unknown phase {n!r} (known: {', '.join(PHASES)})")
    return [p for p in PHASES if p in names]


def check(params: dict[str, Any], topo_desc: dict[str, Any]) -> None:
    """Cross-field checks the per-key schema cannot make."""
    tp = topo_desc["params"]
    if topo_desc["type"] != "streaming-edge":
        raise ScenarioError("topology.type", "the streaming kind needs a streaming-edge topology")
    # Every value but ``phases`` (default: all) is used and has no default.
    require(params, [k for k in SCHEMA if k != "phases"], "streaming")
    for key in ("before.servers", "after.servers"):
        sec, leaf = key.split(".")
        if params[sec][leaf] > tp["servers"]:
            raise ScenarioError(key, f"{params[sec][leaf]} servers, but the topology has "
                                f"{tp['servers']} (topology.servers)")
    f = params["failover"]
    if f["restore_at"] <= f["cut_at"]:
        raise ScenarioError("failover.restore_at", "must come after failover.cut_at")
    if f["restore_at"] >= params["duration"]:
        raise ScenarioError("failover.restore_at", f"must fall inside the phase "
                            f"(duration {params['duration']:g} s)")
    phase_names(params)


def plan(topo_desc: dict[str, Any], params: dict[str, Any],
         rng: random.Random) -> list[Stream]:
    """Every stream of every phase, 5-tuples drawn from the seed."""
    check(params, topo_desc)
    s, before, after = params["streams"], params["before"], params["after"]
    ips = {h["name"]: h["ip"] for h in topo_desc["hosts"]}
    ips.update({h["name"]: h["ip"] for h in topo_desc["external_hosts"]})
    media = sorted((h["name"] for h in topo_desc["hosts"] if h.get("role") == "media"),
                   key=lambda n: int(n[1:]))
    origin = next(h["name"] for h in topo_desc["hosts"] if h.get("role") == "origin")
    isps = topo_desc["params"]["isps"]
    cdns = [f"cdn{i}" for i in range(1, isps + 1)]
    out: list[Stream] = []
    for p_index, phase in enumerate(phase_names(params)):
        early = phase == "before-upgrade"
        servers = before["servers"] if early else after["servers"]
        mix = [("ingest", f"anchor{k % isps + 1}", media[k], s["ingest_mbps"])
               for k in range(servers)]
        big_n = before["big_streams"] if early else after["big_streams"]
        big_rate = before["big_mbps"] if early else s["big_mbps"]
        mix += [("big", origin, cdns[0], big_rate)] * big_n
        normal_n = 0 if early else after["normal_streams"]
        mix += [("normal", origin, cdns[(k + 1) % len(cdns)], s["normal_mbps"])
                for k in range(normal_n)]
        sports = rng.sample(FIXED_SPORTS, len(mix))
        for k, (role, src, dst, rate) in enumerate(mix):
            out.append(Stream(id=f"{phase}/{role}{k + 1}", phase=phase, role=role, src=src,
                              dst=dst, src_ip=ips[src], dst_ip=ips[dst], sport=sports[k],
                              dport=PLAYER_PORT_BASE + p_index, rate_mbps=float(rate),
                              proto=s["proto"], stream_id=k + 1, index=len(out)))
    return out


# -- running ---------------------------------------------------------------------------------
class EdgeRun:
    """The running edge: fabric, routers, counters; runs one phase after the other."""

    def __init__(self, plan_: Any, fabric: Any, progress: Any) -> None:
        self.plan = plan_
        self.fabric = fabric
        self.progress = progress
        self.params = plan_.params
        self.desc = plan_.topo_desc
        self.streams: list[Stream] = plan_.flows
        self.routers = {r["name"]: fabric.host(r["name"]) for r in self.desc["routers"]}
        self.pids = {name: node.pid for name, node in self.routers.items()}
        self.rports = routerstats.router_ports(self.desc)
        self.intfs = {r["name"]: list(r["interfaces"]) for r in self.desc["routers"]}
        self.port_at = {(p.node, p.intf): p for p in self.rports}
        self.att = attachment(self.desc)
        self.adj = adjacency(self.desc)
        self.bridges = [sw["name"] for sw in self.desc["switches"]]
        self.fports = telemetry.fabric_ports(self.desc)
        self.seed = int(self.params["seed"])
        self.base_seeds = {name: 1 + (self.seed * 7919 + i * 104729) % 65521
                           for i, name in enumerate(sorted(self.routers))}
        self.pinned: dict[str, list[int]] = {}

    # -- bring-up beyond the fabric ----------------------------------------------------------
    def start_routing(self) -> dict[str, float]:
        t0 = time.monotonic()
        shutil.chown(self.fabric.run_dir, frr.FRR_USER, frr.FRR_USER)
        for h in self.desc["hosts"]:
            if h.get("role") in ("media", "origin"):
                self.fabric.host(h["name"]).cmd(f"ip route replace default via {GATEWAY_IP}")
        for name, node in self.routers.items():
            # Traceroute answers name the interface a probe arrived on, at any rate.
            node.cmd("sysctl -qw net.ipv4.icmp_errors_use_inbound_ifaddr=1 "
                     "net.ipv4.icmp_ratelimit=0")
            routerstats.install_flow_counters(node.pid, self.intfs[name])
            edgecontrol.set_hash(node, "l3", self.base_seeds[name])
        frr_s = frr.start_routers(list(self.routers.values()), self.fabric.topo.bgp,
                                  self.fabric.run_dir, self.fabric.record)
        est = max(r.wait_established(20) for r in self.routers.values())
        # Multipath is complete when every router holds every prefix with all its paths.
        deadline = time.monotonic() + 20
        for (r, prefix), n in self.expected_paths().items():
            self.routers[r].wait_nexthops(prefix, n, max(0.1, deadline - time.monotonic()))
        return {"frr_start_s": frr_s, "bgp_established_s": est,
                "routing_ready_s": time.monotonic() - t0}

    def expected_paths(self) -> dict[tuple[str, str], int]:
        """(router, prefix) -> nexthops it must hold: one per parallel link towards it."""
        tp = self.desc["params"]
        isps = [r for r in self.desc["routers"] if r["name"].startswith("isp")]
        want = {}
        for r in self.desc["routers"]:
            name = r["name"]
            if name.startswith("isp"):
                want[(name, "10.0.0.0/8")] = tp["borders"] * tp["uplinks"]
                continue
            per_isp = tp["uplinks"] if name.startswith("border") else \
                tp["borders"] * tp["core_links"]
            for isp in isps:
                for net in isp["networks"]:
                    want[(name, net)] = per_isp
            if name.startswith("border"):
                want[(name, "10.0.0.0/8")] = tp["core_links"]
        return want

    def start_sampling(self) -> None:
        """Fabric ports and router ports, sampled on one clock for the whole run."""
        self.sampler = telemetry.Sampler(self.fports, hz=telemetry.SAMPLE_HZ,
                                         controller=self.fabric.controller)
        self.sampler.start()
        while not self.sampler.t0:        # t0 is set by the sampler thread itself
            time.sleep(0.005)
        self.rsampler = routerstats.RouterSampler(self.pids, self.rports, self.sampler.t0,
                                                  hz=telemetry.SAMPLE_HZ)
        self.rsampler.start()

    def wan_delay(self) -> dict[str, float | None]:
        """{uplink port: one-way delay (ms) its root netem has}, read back from the kernel:
        what the uplinks got, not what was asked (without netem they get nothing)."""
        from lab.net.links import root_netem_delay_ms
        out: dict[str, float | None] = {}
        for p in self.rports:
            if p.role != "uplink":
                continue
            shown = routerstats.ns_run(self.pids[p.node], ["tc", "-j", "qdisc", "show",
                                                           "dev", p.intf], check=False).stdout
            try:
                qdiscs = json.loads(shown) if shown.strip() else []
            except ValueError:
                qdiscs = []
            out[p.name] = root_netem_delay_ms(qdiscs)
        return out

    def bgp_state(self) -> dict[str, Any]:
        """Each router's sessions (FRR's word) and its multipath routes (the kernel's)."""
        out = {}
        for name, node in self.routers.items():
            peers = node.bgp_summary().get("peers", {})
            routes = {}
            for (r, prefix), _n in self.expected_paths().items():
                if r == name:
                    routes[prefix] = [h["dev"] for h in node.kernel_nexthops(prefix)]
            out[name] = {"sessions": [{"peer": a, "state": p.get("state"),
                                       "prefixes": p.get("pfxRcd", 0),
                                       "host": p.get("desc", "")}
                                      for a, p in sorted(peers.items())],
                         "multipath_routes": routes}
        return out

    # -- one phase -----------------------------------------------------------------------------
    def configure(self, phase: str, measured: dict[str, float]) -> dict[str, Any]:
        """Rates, hash and placement for ``phase``; returns what was set, for the report."""
        tp = self.desc["params"]
        bw = self.params["before"]["uplink_bw"] if phase == "before-upgrade" \
            else tp["uplink_bw"]
        self.set_uplink_bw(bw)
        for name, tables in self.pinned.items():
            edgecontrol.unpin(self.routers[name], tables)
        self.pinned = {}
        config: dict[str, Any] = {"uplink_bw_mbps": bw}
        mine = [n for n in self.routers if not n.startswith("isp")]
        if phase in ("fix-hash", "failover-link", "failover-border"):
            config.update(self.seed_search(phase, bw))
        else:
            held = {name: edgecontrol.set_hash(node, "l3", self.base_seeds[name])
                    for name, node in self.routers.items()}
            config["hash"] = {n: {"mode": "l3", "seed": held[n]["seed"]} for n in mine}
        if phase == "fix-placement":
            config["placement"] = self.place_by_load(phase, measured)
        return config

    def set_uplink_bw(self, bw: float) -> None:
        burst = htb_burst_bytes(bw * 1e6)
        for p in self.rports:
            if p.role == "uplink":
                out = self.routers[p.node].cmd(
                    f"tc class change dev {p.intf} parent 1: classid 1:1 htb rate {bw}mbit "
                    f"ceil {bw}mbit burst {burst} cburst {burst} quantum 100000; echo __rc=$?")
                if not out.strip().endswith("__rc=0"):
                    raise MachineError("topology.uplink_bw", f"{p.intf}: {out.strip()}")
        self.uplink_bw = bw

    def egress(self, phase: str) -> list[Stream]:
        return [s for s in self.streams if s.phase == phase and s.role != "ingest"]

    def peer_of(self, node: str, intf: str) -> tuple[str, str]:
        p = self.port_at[(node, intf)]
        return p.peer, p.peer_intf

    def predict_uplinks(self, streams: list[Stream]) -> dict[str, str]:
        """stream id -> the uplink (``border-ethX->isp-ethY``) the kernel would choose."""
        first = edgecontrol.predict(self.routers[CORE], CORE_FABRIC_INTF,
                                    [s.tuple for s in streams])
        by_border: dict[tuple[str, str], list[Stream]] = {}
        for s, dev in zip(streams, first, strict=True):
            border, b_intf = self.peer_of(CORE, dev)
            by_border.setdefault((border, b_intf), []).append(s)
        out = {}
        for (border, b_intf), group in by_border.items():
            devs = edgecontrol.predict(self.routers[border], b_intf, [s.tuple for s in group])
            for s, dev in zip(group, devs, strict=True):
                _, pintf = self.peer_of(border, dev)
                out[s.id] = f"{dev}->{pintf}"
        return out

    def seed_search(self, phase: str, bw: float) -> dict[str, Any]:
        """L4 hash everywhere we own; seeds per tier tried until the elephants spread."""
        streams = self.egress(phase)
        best: tuple[float, int, dict[str, str]] | None = None
        seedable = True
        for attempt in range(SEED_TRIES):
            for name, node in self.routers.items():
                if not name.startswith("isp"):
                    held = edgecontrol.set_hash(node, "l4", self.tier_seed(name, attempt))
                    seedable = held["seed"] is not None
            pred = self.predict_uplinks(streams)
            load: dict[str, float] = {}
            for s in streams:
                load[pred[s.id]] = load.get(pred[s.id], 0.0) + s.rate_mbps
            hottest = max(load.values(), default=0.0) / bw
            if best is None or hottest < best[0]:
                best = (hottest, attempt, pred)
            if hottest <= SEED_TARGET_UTIL or not seedable:   # no seed: one hash to try
                break
        assert best is not None
        hottest, attempt, pred = best
        seeds = {}
        for name, node in self.routers.items():
            if not name.startswith("isp"):       # the ISPs are not ours: they keep L3
                held = edgecontrol.set_hash(node, "l4", self.tier_seed(name, attempt))
                seeds[name] = {"mode": "l4", "seed": held["seed"]}
        return {"hash": seeds, "seed_tries": attempt + 1, "seedable": seedable,
                "predicted_uplink": pred, "predicted_hottest_util": round(hottest, 3)}

    def tier_seed(self, name: str, attempt: int) -> int:
        """The seed a router of ours gets in seed-search ``attempt``: dccore and the borders
        step differently, so the two tiers never share a seed (the same hash at two tiers
        polarises: a border would send all it gets from one dccore bucket to one uplink)."""
        if name == CORE:
            return self.base_seeds[name] + attempt
        return self.base_seeds[name] + 7 * attempt + 1

    def place_by_load(self, phase: str, measured: dict[str, float]) -> dict[str, str]:
        """Greedy: biggest measured stream first, each onto the least-loaded uplink."""
        streams = self.egress(phase)
        twin = {s.id.split("/", 1)[1]: s for s in self.egress("incident")}
        uplinks = [p for p in self.rports if p.role == "uplink" and p.node.startswith("border")]
        load = {p.name: 0.0 for p in uplinks}
        core_rules: list[tuple[FiveTuple, str, str]] = []
        border_rules: dict[str, list[tuple[FiveTuple, str, str]]] = {}
        placed = {}

        def rate(s: Stream) -> float:
            t = twin.get(s.id.split("/", 1)[1])
            return measured.get(t.id, s.rate_mbps) if t else s.rate_mbps

        for s in sorted(streams, key=rate, reverse=True):
            isp = self.isp_of(s.dst)
            choices = [p for p in uplinks if p.peer == isp]
            best = min(choices, key=lambda p: (load[p.name], p.name))
            load[best.name] += rate(s)
            placed[s.id] = best.name
            core_link = next(p for p in self.rports if p.node == CORE and p.peer == best.node)
            core_rules.append((s.tuple, core_link.intf, self.addr_of(best.node,
                                                                     core_link.peer_intf)))
            border_rules.setdefault(best.node, []).append(
                (s.tuple, best.intf, self.addr_of(best.peer, best.peer_intf)))
        self.pinned[CORE] = edgecontrol.pin(self.routers[CORE], core_rules)
        for border, rules in border_rules.items():
            self.pinned[border] = edgecontrol.pin(self.routers[border], rules)
        return placed

    def isp_of(self, host: str) -> str:
        for ln in self.desc["router_links"]:
            if ln["b"] == host:
                return ln["a"]
        raise KeyError(host)

    def addr_of(self, node: str, intf: str) -> str:
        r = next(x for x in self.desc["routers"] if x["name"] == node)
        return r["interfaces"][intf][0].split("/")[0]

    def run_phase(self, phase: str, index: int, measured: dict[str, float]) -> dict[str, Any]:
        duration = float(self.params["duration"])
        marks = [("start", time.monotonic())]
        config = self.configure(phase, measured)
        marks.append(("configure", time.monotonic()))
        streams = [s for s in self.streams if s.phase == phase]
        work = self.fabric.run_dir / "streams" / phase
        work.mkdir(parents=True, exist_ok=True)
        players = self.start_players(streams, work, duration)
        marks.append(("players", time.monotonic()))
        window = Window(self.sampler, self.fports, self.bridges)
        before_r = routerstats.snapshot(self.pids, self.rports)
        nft0 = {n: routerstats.read_flow_counters(p, self.intfs[n]) for n, p in self.pids.items()}
        window.open()
        t_unix = time.time()
        senders = self.start_senders(streams, work, duration)
        self.progress(f"[{phase}] {len(streams)} streams for {duration:g} s "
                      f"(uplinks {config['uplink_bw_mbps']:g} Mbit/s)")
        events: dict[str, Any] = {}
        if phase.startswith("failover"):
            events = self.failover(phase, config, t_unix)
        with Ticker(duration, f"[{phase}] streaming"):
            for proc in senders + players:
                try:
                    proc.wait(timeout=duration + 30)
                except Exception:
                    proc.kill()
                    proc.wait()
        marks.append(("traffic", time.monotonic()))
        window.close()
        after_r = routerstats.snapshot(self.pids, self.rports)
        nft1 = {n: routerstats.read_flow_counters(p, self.intfs[n]) for n, p in self.pids.items()}
        t_start, t_end, measured_s = window.t_start, window.t_end, window.measured_s
        for s in streams:
            s.summary = self.read_stream(s, work)
        ovs = window.flow_deltas()
        nft = {n: routerstats.delta(nft1[n], nft0[n]) for n in nft1}
        links = window.links()
        links += self.router_link_entries(before_r, after_r, measured_s, t_start, config)
        flows = [self.flow_entry(s, ovs, nft) for s in streams]
        marks.append(("collect", time.monotonic()))
        if phase in PROBE_PHASES:
            self.probe(phase, flows)
        marks.append(("probe", time.monotonic()))
        # CPU is judged over the streaming itself, from the last sender's first frame to the
        # end of the longest stream: starting a dozen Python senders is the lab's set-up.
        sent = [x for s in streams if (x := s.summary.get("sender"))
                and x.get("t0_monotonic") is not None]
        t_fid, t_fid_end = t_start, t_end
        if sent:
            t_fid = min(max(t_start, *(x["t0_monotonic"] - self.sampler.t0 for x in sent)), t_end)
            t_fid_end = min(max(t_fid, *(x["t0_monotonic"] + (x.get("elapsed_s") or 0)
                                         - self.sampler.t0 for x in sent)), t_end)
        judged = window.judge(t_fid, t_fid_end)
        return {"timings": {f"{b[0]}_s": round(b[1] - a[1], 3)
                            for a, b in itertools.pairwise(marks)},
                "config": config, "duration_s": round(measured_s, 3), "links": links,
                "flows": flows, "events": events, "cpu_idle_pct": judged["cpu_idle_pct"],
                "cpu_idle_min_pct": judged["cpu_idle_min_pct"],
                "lab_cpu_pct": judged["lab_cpu_pct"], "fidelity_window_s": judged["window_s"]}

    def probe(self, phase: str, flows: list[dict[str, Any]]) -> None:
        """TTL-limited probes with each origin stream's 5-tuple: which uplink does it hash to?

        The ISP answers from the address of the interface the probe arrived on
        (``icmp_errors_use_inbound_ifaddr``), which names the uplink; max TTL 3 (dccore,
        border, ISP) so no probe reaches the CDN node.
        """
        mine = [f for f in flows if f["role"] != "ingest"]
        if not mine:
            return
        by_addr = {a.split("/")[0]: (r["name"], intf) for r in self.desc["routers"]
                   for intf, addrs in r["interfaces"].items() for a in addrs}
        arg = json.dumps([[f["proto"], f["src_ip"], f["dst_ip"], f["sport"], f["dport"]]
                          for f in mine])
        origin = self.host(mine[0]["src"])
        out = origin.cmd(f"{shlex.join(agents.command('probe'))} --max-ttl 3 --timeout 2 "
                         f"--flows '{arg}'")
        start = out.find('{"flows"')
        traces = json.loads(out[start:])["flows"] if start >= 0 else [[] for _ in mine]
        for f, hops in zip(mine, traces, strict=True):
            uplink = None
            for hop in hops:
                _, intf = by_addr.get(hop["from"], (None, None))
                port = next((p for p in self.rports if p.peer_intf == intf
                             and p.role == "uplink" and p.node.startswith("border")), None)
                if port is not None:
                    uplink = port.name
            f["probe"] = {"hops": [{**h, "node": by_addr.get(h["from"], ("?", ""))[0],
                                    "intf": by_addr.get(h["from"], ("", "?"))[1]}
                                   for h in hops],
                          "uplink": uplink,
                          "agrees": uplink is not None and f["uplinks"] == [uplink]}

    # -- processes -----------------------------------------------------------------------------
    def start_players(self, streams: list[Stream], work: Path, duration: float) -> list[Any]:
        procs = []
        by_dst: dict[str, list[Stream]] = {}
        for s in streams:
            by_dst.setdefault(s.dst, []).append(s)
        ready = []
        for dst, group in by_dst.items():
            node = self.host(dst)
            rf = work / f"{dst}.ready"
            cmd = [*agents.command("streamer"), "play", "--proto", group[0].proto,
                   "--bind", group[0].dst_ip, "--port", str(group[0].dport),
                   "--streams", str(len(group)),
                   # A guard against senders that never come, not a schedule: the senders
                   # start after every player is ready, which may take programs.READY_TIMEOUT_S.
                   "--timeout", f"{duration + programs.READY_TIMEOUT_S + 25:g}",
                   "--ready-file", str(rf), "--out", str(work / f"{dst}.play.json")]
            proc = node.popen(cmd, stdout=open(work / f"{dst}.play.log", "wb"),  # noqa: SIM115
                              stderr=subprocess.STDOUT)
            self.fabric.record.add_pid(proc.pid, f"player {dst}")
            procs.append(proc)
            ready.append(rf)
        # A player says it is ready by its file; one that died is reported at once.
        dead, waiting = programs.wait_ready(ready, procs, stop_at_death=True)
        if dead or waiting:
            raise MachineError("streams", f"players not ready "
                               f"({'exited' if dead else 'timed out'}): {dead or waiting}")
        return procs

    def start_senders(self, streams: list[Stream], work: Path, duration: float) -> list[Any]:
        procs = []
        sp = self.params["streams"]
        for s in streams:
            cmd = [*agents.command("streamer"), "send", "--stream-id",
                   str(s.stream_id), "--proto", s.proto, "--bind", s.src_ip, "--sport",
                   str(s.sport), "--dst", s.dst_ip, "--dport", str(s.dport), "--rate-mbps",
                   f"{s.rate_mbps:g}", "--fps", f"{sp['fps']:g}", "--duration", f"{duration:g}",
                   "--linger", "10", "--out", str(work / f"{s.stream_id}.send.json"),
                   "--ready-file", str(work / f"{s.stream_id}.send.ready")]
            if s.proto == "tcp":
                cmd += ["--cc", sp["cc"]]
            log = open(work / f"{s.stream_id}.send.log", "wb")  # noqa: SIM115
            proc = self.host(s.src).popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            self.fabric.record.add_pid(proc.pid, f"sender {s.id}")
            procs.append(proc)
        # Every stream of the phase starts at once, when all are connected.
        programs.go([work / f"{s.stream_id}.send.ready" for s in streams], procs)
        return procs

    def host(self, name: str) -> Any:
        return self.fabric.host(name)

    def read_stream(self, s: Stream, work: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            play = json.loads((work / f"{s.dst}.play.json").read_text())
            out["player"] = next((x for x in play["streams"] if x["stream_id"] == s.stream_id),
                                 None)
        except (OSError, ValueError, KeyError):
            out["player"] = None
        try:
            out["sender"] = json.loads((work / f"{s.stream_id}.send.json").read_text())
        except (OSError, ValueError):
            out["sender"] = None
        return out

    # -- failover ------------------------------------------------------------------------------
    def failover(self, phase: str, config: dict[str, Any], t0_unix: float) -> dict[str, Any]:
        """Cut mid-phase, watch the routes go and come back; returns the times measured."""
        f = self.params["failover"]
        if phase == "failover-link":
            # The uplink carrying the most big streams, and the border whose route uses it.
            pred = config.get("predicted_uplink", {})
            counts: dict[str, int] = {}
            for sid, up in pred.items():
                if "/big" in sid:
                    counts[up] = counts.get(up, 0) + 1
            target = max(sorted(counts), key=lambda u: counts[u])
            port = next(p for p in self.rports if p.name == target)
            cuts = [(port.node, [port.intf]), (port.peer, [port.peer_intf])]
            watcher = (port.node, self.dst_prefix("cdn1"), port.intf)
            what = target
        else:
            border = "border1"
            mine = [p for p in self.rports if p.node == border]
            cuts = [(border, [p.intf for p in mine])]
            by_peer: dict[str, list[str]] = {}
            for p in mine:
                by_peer.setdefault(p.peer, []).append(p.peer_intf)
            cuts += list(by_peer.items())
            core_port = next(p for p in self.rports if p.node == CORE and p.peer == border)
            watcher = (CORE, self.dst_prefix("cdn1"), core_port.intf)
            what = border
        node, prefix, dev = watcher
        watch = RouteWatch(self.routers[node], prefix, dev)
        watch.start()
        time.sleep(max(0.0, t0_unix + f["cut_at"] - time.time()))
        t_cut = time.time()
        for name, intfs in cuts:
            edgecontrol.cut(self.routers[name], intfs)
        time.sleep(max(0.0, t0_unix + f["restore_at"] - time.time()))
        t_restore = time.time()
        for name, _ in cuts:
            edgecontrol.restore(self.routers[name])
        back_deadline = time.time() + 15
        while watch.back_at is None and time.time() < back_deadline:
            time.sleep(0.05)
        watch.stop()
        return {"cut": what, "watched_router": node, "watched_prefix": prefix,
                "watched_dev": dev, "cut_unix": t_cut, "restore_unix": t_restore,
                "phase_start_unix": t0_unix,
                "withdrawn_after_s": None if watch.gone_at is None
                else round(watch.gone_at - t_cut, 3),
                "returned_after_s": None if watch.back_at is None
                else round(watch.back_at - t_restore, 3)}

    def dst_prefix(self, host: str) -> str:
        ln = next(x for x in self.desc["router_links"] if x["b"] == host)
        return ln["subnet"]

    # -- result entries -----------------------------------------------------------------------
    def router_link_entries(self, before: dict, after: dict, duration_s: float,
                            t_start: float, config: dict[str, Any]) -> list[dict[str, Any]]:
        entries = []
        for p in self.rports:
            b, a = before[p], after[p]
            bw = config["uplink_bw_mbps"] if p.role == "uplink" else p.bw_mbps
            tx = a.tx_bytes - b.tx_bytes
            s = self.rsampler.series[p]
            idx = [i for i, t in enumerate(s.t) if t_start <= t <= t_start + duration_s + 0.05]
            bps = [round(s.tx_bps[i]) for i in idx]
            entries.append({
                "name": p.name, "node": p.node, "port": p.port, "peer": p.peer,
                "intf": p.intf, "peer_intf": p.peer_intf, "role": p.role, "up": True,
                "bw_mbps": bw, "tx_bytes": tx, "tx_packets": a.tx_packets - b.tx_packets,
                "drops": a.drops - b.drops,
                "util_mean": round(tx * 8 / duration_s / (bw * 1e6), 4),
                "util_max": round(max(bps, default=0) / (bw * 1e6), 4),
                "ce_marked": 0,          # the routers' queues do not mark
                "series": {"t": [round(s.t[i] - t_start, 3) for i in idx], "tx_bps": bps}})
        return entries

    def flow_entry(self, s: Stream, ovs: dict, nft: dict) -> dict[str, Any]:
        spec = s.spec()
        fwd, rev = spec.watch_entries(s.index)
        hops = {sw: c.get(fwd["cookie"], (0, 0))[1] for sw, c in ovs.items()}
        rhops = {sw: c.get(rev["cookie"], (0, 0))[1] for sw, c in ovs.items()}
        att = self.att
        path, clean = path_from_counters(hops, att.get(s.src, att[CORE]), self.adj)
        rpath, _ = path_from_counters(rhops, att.get(s.dst, att[CORE]), self.adj)
        key = (s.src_ip, s.dst_ip, s.proto, s.sport, s.dport)
        router_hops = self.router_path(key, CORE if s.role != "ingest" else self.isp_of(s.src),
                                       nft)
        player = s.summary.get("player") or {}
        sender = s.summary.get("sender") or {}
        first_bytes = hops.get(path[0], 0) if path else 0
        nodes: list[str] = []
        for h in router_hops:
            nodes += [n for n in (h["from"], h["to"]) if n not in nodes]
        entry = {
            "id": s.id, "kind": "stream", "role": s.role, "phase": s.phase, "src": s.src,
            "dst": s.dst, "src_ip": s.src_ip, "dst_ip": s.dst_ip, "proto": s.proto,
            "sport": s.sport, "dport": s.dport, "offered_bps": s.rate_mbps * 1e6,
            "path": path, "path_clean": clean, "hop_bytes": {sw: hops[sw] for sw in path},
            "reverse_path": rpath, "reverse_hop_bytes": {sw: rhops[sw] for sw in rpath},
            "router_hops": router_hops,
            # Every node in travel order: the fabric's switches, then the routers (or the
            # other way round for an anchor's push into the DC).
            "full_path": path + nodes if s.role != "ingest" else nodes + path,
            "uplinks": [h["link"] for h in router_hops if h["role"] == "uplink"],
            "bytes": first_bytes or (router_hops[0]["sent"] if router_hops else 0),
            "goodput_bps": player.get("goodput_bps", 0.0),
            "loss": round(sum(h["lost"] for h in router_hops)
                          / max(1, router_hops[0]["sent"]), 5) if router_hops else 0.0,
            "retransmits": ((sender.get("tcp") or {}).get("total_retrans", 0)),
            "stalls": player.get("stalls", 0), "stall_s": player.get("stall_s", 0.0),
            "frames_expected": player.get("frames_expected", 0),
            "frames_lost": player.get("frames_lost", 0),
            "lost_pct": player.get("lost_pct", 100.0 if not player else 0.0),
            "jitter_ms": player.get("jitter_ms"), "max_gap_s": player.get("max_gap_s"),
            "max_gap_start_unix": player.get("max_gap_start_unix"),
            "end_reason": player.get("end_reason"), "received": bool(player),
            # The player's timeline, so a report can draw when each stall happened.
            "playout": {k: player.get(k) for k in ("first_arrival_unix", "startup_delay_s",
                                                    "play_end_s", "stall_events")},
        }
        return entry

    def router_path(self, key: tuple, start: str, nft: dict) -> list[dict[str, Any]]:
        """The links the flow crossed between routers, from the routers' own counters.

        Every link a router sent the flow out of is listed (more than one per router after
        a failover); ``sent`` is what the sending router counted leaving, ``arrived`` what
        the far router counted coming in, ``lost`` the difference.
        """
        routers = set(self.routers)
        out = []
        todo, seen = [start], set()
        while todo:
            node = todo.pop(0)
            if node in seen:
                continue
            seen.add(node)
            for intf in self.intfs[node]:
                sent = nft[node].get((intf, "out"), {}).get(key, 0)
                if sent <= 0:
                    continue
                port = self.port_at.get((node, intf))
                if port is None:
                    continue          # the fabric side: counted by OVS
                peer, pintf, role = port.peer, port.peer_intf, port.role
                arrived = nft[peer].get((pintf, "in"), {}).get(key, 0) if peer in routers \
                    else None
                out.append({"link": f"{intf}->{pintf}", "from": node, "to": peer,
                            "role": role, "sent": sent, "arrived": arrived,
                            "lost": max(0, sent - arrived) if arrived is not None else 0})
                if peer in routers:
                    todo.append(peer)
        return out


class RouteWatch(threading.Thread):
    """Polls a router's kernel route for ``prefix``: when ``dev`` leaves it and comes back."""

    def __init__(self, node: Any, prefix: str, dev: str, period_s: float = 0.01) -> None:
        super().__init__(daemon=True, name="fabriclab-route-watch")
        self.pid, self.prefix, self.dev, self.period = node.pid, prefix, dev, period_s
        self.gone_at: float | None = None
        self.back_at: float | None = None
        self._stop_evt = threading.Event()

    def run(self) -> None:
        while not self._stop_evt.wait(self.period):
            out = routerstats.ns_run(self.pid, ["ip", "-j", "route", "show", "exact",
                                                self.prefix], check=False).stdout
            try:
                routes = json.loads(out) if out.strip() else []
            except ValueError:
                continue
            devs = [nh.get("dev") for r in routes for nh in r.get("nexthops", [r])]
            now = time.time()
            if self.dev not in devs and self.gone_at is None:
                self.gone_at = now
            elif self.dev in devs and self.gone_at is not None and self.back_at is None:
                self.back_at = now

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=5)


# -- the whole run -----------------------------------------------------------------------------
def run(plan_: Any, fabric: Any, progress: Any, _prepared: Any = None) -> dict[str, Any]:
    """Bring the edge up (fabric, FRR routers, BGP), then the phases one after another."""
    fabric.gateways = frozenset({CORE})
    progress(f"bringing up streaming-edge: {len(plan_.topo_desc['switches'])} switches, "
             f"{len(plan_.topo_desc['routers'])} FRR routers, controller "
             f"{plan_.runtime}")
    fabric.start()
    edge = EdgeRun(plan_, fabric, progress)
    timings = edge.start_routing()
    progress(f"BGP up: sessions in {timings['bgp_established_s']:.2f} s, multipath "
             f"routes in {timings['routing_ready_s']:.2f} s")
    bgp = edge.bgp_state()
    wan = edge.wan_delay()
    watch = [e for s in edge.streams for e in s.spec().watch_entries(s.index)]
    reply = fabric.controller.request({"cmd": "watch", "flows": watch})
    if not reply.get("ok"):
        raise MachineError("controller", str(reply.get("error")))
    edge.start_sampling()
    phases: dict[str, Any] = {}
    measured: dict[str, float] = {}
    try:
        for i, phase in enumerate(phase_names(plan_.params)):
            phases[phase] = edge.run_phase(phase, i, measured)
            if phase == "incident":
                measured = {f["id"]: f["bytes"] * 8 / phases[phase]["duration_s"] / 1e6
                            for f in phases[phase]["flows"]}
            progress(f"[{phase}] " + _phase_line(phase_metrics(phases[phase])))
    finally:
        edge.sampler.stop()
        edge.rsampler.stop()
    bgp_after = edge.bgp_state()
    return assemble(plan_, phases, bgp, bgp_after, timings, wan)


def wan_fidelity(asked_ms: float, got: dict[str, float | None]
                 ) -> tuple[dict[str, Any], str | None]:
    """``fidelity`` entries for the uplinks' WAN delay, and a note when it is not what was
    asked: ``wan_delay`` is ``netem`` only when every uplink's root netem has the delay."""
    values = sorted({v for v in got.values() if v is not None})
    entries: dict[str, Any] = {"wan_delay_ms_asked": asked_ms, "wan_delay_ms": values}
    if asked_ms and got and all(v is not None and abs(v - asked_ms) < 1e-3 for v in got.values()):
        return {"wan_delay": "netem", **entries}, None
    if not asked_ms:
        return {"wan_delay": "none (not asked)", **entries}, None
    if not any(v is not None for v in got.values()):
        return ({"wan_delay": "none (no netem)", **entries},
                f"no netem: the ISPs' WAN links have no delay ({asked_ms:g} ms asked)")
    wrong = sorted(k for k, v in got.items() if v is None or abs(v - asked_ms) >= 1e-3)
    return ({"wan_delay": "partial", **entries},
            f"WAN delay {asked_ms:g} ms asked, but {', '.join(wrong)} read back otherwise")


def keep_logs(work: Path, out_dir: Path) -> None:
    """The routers' logs and the streams' JSON (the controller's log is kept by every run)."""
    for log in work.glob("*/*.log"):
        (out_dir / "frr" / log.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(log, out_dir / "frr" / log.parent.name / log.name)
    if (work / "streams").is_dir():
        shutil.copytree(work / "streams", out_dir / "streams", dirs_exist_ok=True)


def phase_metrics(ph: dict[str, Any]) -> dict[str, Any]:
    """A phase's summary (frames lost, stalls, the hottest uplink), plus what explains it."""
    flows = ph["flows"]
    uplinks = {ln["name"]: ln for ln in ph["links"] if ln.get("role") == "uplink"
               and ln["node"].startswith("border")}
    expected = sum(f["frames_expected"] for f in flows)
    lost = sum(f["frames_lost"] for f in flows)
    hot = max(uplinks.values(), key=lambda ln: ln["util_mean"], default=None)
    cap = sum(ln["bw_mbps"] * 1e6 for ln in uplinks.values())
    used = sum(ln["tx_bytes"] * 8 / ph["duration_s"] for ln in uplinks.values())
    out = {
        "stalls": sum(f["stalls"] for f in flows),
        "stall_s": round(sum(f["stall_s"] for f in flows), 3),
        "uplinks": {n: ln["util_mean"] for n, ln in uplinks.items()},
        "uplink_drops": {n: ln["drops"] for n, ln in uplinks.items()},
        "streams_lost_pct": round(100 * lost / expected, 3) if expected else 0.0,
        "fidelity_valid": ph["cpu_idle_min_pct"] >= telemetry.MIN_CPU_IDLE_PCT
        and all(f["received"] for f in flows),
        "fidelity_window_s": ph.get("fidelity_window_s"),
        "hottest_uplink": hot["name"] if hot else None,
        "hottest_util": hot["util_mean"] if hot else 0.0,
        "uplinks_idle": sorted(n for n, ln in uplinks.items() if ln["util_mean"] < 0.05),
        "capacity_used": round(used / cap, 4) if cap else 0.0,
        "offered_mbps": round(sum(f["offered_bps"] for f in flows) / 1e6, 3),
        "streams": len(flows),
        "stalled_streams": sorted(f["id"] for f in flows if f["stalls"] > 0),
        "retransmits": sum(f["retransmits"] for f in flows),
        "config": ph["config"],
    }
    if ph["events"]:
        ev = ph["events"]
        crossing = [f for f in flows if any(ev["cut"] in (h["link"], h["from"], h["to"])
                                           for h in f["router_hops"])]
        out["failover"] = {
            **{k: v for k, v in ev.items() if not k.endswith("_unix")},
            "streams_on_cut": sorted(f["id"] for f in crossing),
            "outage_s": {f["id"]: round(f["max_gap_s"] or 0.0, 3) for f in crossing},
            # Silently lost: the player never saw it, or it ended without its sender's
            # clean close (TCP) / end marker (UDP), or frames went missing unaccounted.
            "streams_lost": sorted(f["id"] for f in flows if not f["received"]
                                   or f["end_reason"] not in ("eof", "end-marker")),
        }
    return out


def _phase_line(mt: dict[str, Any]) -> str:
    return (f"stalls {mt['stalls']} ({mt['stall_s']:.1f} s), lost {mt['streams_lost_pct']:.2f}%, "
            f"hottest uplink {mt['hottest_uplink']} {mt['hottest_util'] * 100:.0f}% "
            f"({mt['uplink_drops'].get(mt['hottest_uplink'], 0)} drops), "
            f"{len(mt['uplinks_idle'])} of {len(mt['uplinks'])} uplinks idle")


def assemble(plan_: Any, phases: dict[str, Any], bgp: dict[str, Any],
             bgp_after: dict[str, Any], timings: dict[str, Any],
             wan: dict[str, float | None]) -> dict[str, Any]:
    """result.json: top-level links/flows are the incident's (what diagnose explains);
    every phase's own are under ``phase_details``."""
    main = phases.get("incident") or next(iter(phases.values()))
    metrics: dict[str, Any] = {"phases": {n: phase_metrics(p) for n, p in phases.items()},
                               "bgp": bgp, "bgp_after": bgp_after}
    valid = all(m["fidelity_valid"] for m in metrics["phases"].values())
    notes = list(plan_.env.notes)
    for n, p in phases.items():
        if p["cpu_idle_min_pct"] < telemetry.MIN_CPU_IDLE_PCT:
            notes.append(f"{n}: CPU-bound ({p['cpu_idle_min_pct']:.0f}% idle)")
    wan_fields, wan_note = wan_fidelity(float(plan_.topo_desc["params"].get("wan_delay_ms", 0)),
                                        wan)
    if wan_note:
        notes.append(wan_note)
    result = {
        "schema": SCHEMA_VERSION, "kind": "streaming", "scenario": plan_.scenario.name,
        **plan_.policy_fields(), "seed": int(plan_.params["seed"]),
        "duration_s": main["duration_s"], "phase": "incident" if "incident" in phases
        else next(iter(phases)),
        "environment": plan_.env.as_result(), "topology": plan_.topo_desc,
        "params": plan_.params, "links": main["links"], "flows": main["flows"],
        "metrics": metrics, "timings": timings,
        "phase_details": phases,
        "fidelity": {"cpu_idle_min_pct": min(p["cpu_idle_min_pct"] for p in phases.values()),
                     "lab_cpu_pct": telemetry.worst_lab_cpu_pct(
                         p["lab_cpu_pct"] for p in phases.values()),
                     "valid": valid, "notes": notes, **wan_fields},
    }
    result["fidelity"]["datapath_loss_bytes"] = diagnose.unexplained_loss(result)
    return result


def analyse(result: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    return result["metrics"]


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [(name, _phase_line(mt)) for name, mt in result["metrics"]["phases"].items()]
