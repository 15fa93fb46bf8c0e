"""What a collective phase left behind, read once its job has ended: every connection's
flow (path from the switches' counters, TCP_INFO from its sender), the links with their CE
marks, the phase's fidelity window and its metrics.

``JobReadout`` is the part of ``lab.kinds.collective.run.JobRun`` that does this.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.analysis import pauses, uplinks
from lab.kinds.base import Plan
from lab.kinds.collective import gloo, gpuwait, otherjob
from lab.kinds.collective import metrics as jm
from lab.kinds.collective import plan as planning
from lab.kinds.collective.plan import Conn
from lab.kinds.collective.programs import load
from lab.kinds.collective.scheduler import scheduler_map
from lab.kinds.collective.setup import Phase
from lab.measure import ecnwire, headroom
from lab.measure.result import flow_entries
from lab.measure.window import Window


@dataclass
class Drive:
    """What the job's run left to read: its window, when the job ended, ECN and TCP counters
    at both ends, the receiver's capture and the micro-bursts (incast)."""

    window: Window
    t_job_end: float = 0.0
    ecn0: dict[str, dict[str, int]] = field(default_factory=dict)
    ecn1: dict[str, dict[str, int]] = field(default_factory=dict)
    tcp0: dict[str, dict[str, int]] = field(default_factory=dict)
    tcp1: dict[str, dict[str, int]] = field(default_factory=dict)
    capture: Any = None
    bursts: dict[str, Any] | None = None
    elephants: Any = None          # lab.workloads.traffic.FlowRunner of the phase's elephants
    leaves0: dict[str, Any] = field(default_factory=dict)   # the classes' counters before
    lossless: dict[str, Any] = field(default_factory=dict)  # PFC's and the classes' after
    stalls: list[str] = field(default_factory=list)  # why a job on MPTCP hung, if it did


def sum_delta(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
               ) -> dict[str, int]:
    total: dict[str, int] = {}
    for host, vals in after.items():
        for k, v in vals.items():
            total[k] = total.get(k, 0) + v - before.get(host, {}).get(k, 0)
    return total


def flow_id(f: dict[str, Any]) -> dict[str, Any]:
    """The 5-tuple and id of a flow entry: what a capture is matched against."""
    return {k: f[k] for k in ("id", "src_ip", "dst_ip", "proto", "sport", "dport")}


class JobReadout:
    """Reading a phase's counters and programs' records (a part of ``JobRun``)."""

    plan: Plan
    topo: dict[str, Any]
    bw: dict[tuple[str, str], float]
    leaf_of: dict[str, str]
    marked: set[str]
    # RoceJob's: a ring QP's counters from its rank, and the incast's QPs' results
    attach_roce_results: Callable[[list[Conn], list[dict[str, Any]]], None]
    incast_results: Callable[[list[Conn], Path], dict[str, Any]]
    ring_reordering: Callable[[list[dict[str, Any]]], dict[str, int]]

    def bottleneck_bps(self, flows: list[dict[str, Any]]) -> float:
        """The slowest configured link any of the job's connections crossed."""
        rates = []
        for f in flows:
            hops = [f["src"], *f["path"], f["dst"]]
            rates += [self.bw[(a, b)] for a, b in itertools.pairwise(hops)
                      if (a, b) in self.bw]
        return min(rates, default=0.0)

    def phase_result(self, ph: Phase, d: Drive) -> dict[str, Any]:
        """The phase's links, flows (paths from the switches' counters) and metrics."""
        pp, window, work = ph.pp, d.window, ph.work
        all_conns = ph.all_conns()
        outputs = self.read_outputs(pp, ph.hosts, ph.conns, work)
        (self.attach_roce_results if pp["job"]["transport"] == "roce"
         else self.attach_results)(ph.conns, outputs)
        incast = self.incast_results(ph.iconns, work) if ph.iconns else None
        self.attach_loader_results(ph.lconns, outputs)
        self.attach_client_results(ph.sconns, work)
        flows = flow_entries([c.spec for c in all_conns], window.flow_deltas(), self.topo,
                             [c.index for c in all_conns])
        for f, c in zip(flows, all_conns, strict=True):
            f["epoch"], f["rank"] = c.epoch, c.rank
        self.mark_mgmt_flows(flows)
        links = window.links()
        for ln in links:
            c0, c1 = d.ecn0.get(ln["intf"], {}), d.ecn1.get(ln["intf"], {})
            ln["ce_marked"] = c1.get("ce_marked", 0) - c0.get("ce_marked", 0)
            ln["ecn_marking"] = ph.marking if ln["intf"] in self.marked else None
        judged = window.judge(*self.fidelity_window(outputs, d),
                              spare=gpuwait.spare_work(outputs, window.sampler.t0))
        metrics = self.phase_metrics(pp, ph.hosts, outputs, flows, links, work, d.stalls)
        metrics["retransmits"] = sum(f["retransmits"] for f in flows
                                     if f["kind"] in ("allreduce", "incast"))
        metrics["tcp"] = sum_delta(d.tcp0, d.tcp1)
        metrics["ce_marked"] = sum(ln["ce_marked"] for ln in links)
        metrics["marking"] = {"mechanism": self.plan.env.ecn, "config": ph.marking,
                              "ports": sorted(self.marked)}
        if ph.k_rule is not None:
            metrics["marking"]["k_rule"] = ph.k_rule
        metrics.update(self.settings_used(ph, outputs, flows))
        metrics.update(self.roce_metrics(ph, outputs, links))
        metrics["cpu_idle_min_pct"] = judged["cpu_idle_min_pct"]
        metrics["lab_cpu_pct"] = judged["lab_cpu_pct"]
        metrics["fidelity_window_s"] = judged["window_s"]
        if "spare_work" in judged:
            metrics["spare_work"] = judged["spare_work"]
        metrics.update(headroom.cpu_fields(judged))
        metrics["fidelity_valid"] = (headroom.cpu_verdict(judged) is None
                                     and not metrics["errors"]    # the ranks', stalls
                                     and not (incast or {}).get("lost"))
        if incast is not None:
            metrics["incast"] = incast
        if d.lossless:
            metrics.update(pauses.summary(d.lossless["classes"], d.lossless["pfc"],
                                          d.lossless["pfc_feeders"]))
        if d.capture is not None:
            metrics["wire"] = ecnwire.summarize(work / "receiver.pcap",
                                                [flow_id(f) for f in flows])
            (work / "receiver.pcap").unlink(missing_ok=True)   # captures are not kept
        if d.bursts is not None:
            metrics["microburst"] = d.bursts
        # The window's start on the clock the ranks stamp (``time.monotonic``, the head's
        # over a cluster): a rank's time t is at t - t_window_start on the links' series.
        out = {"duration_s": round(window.measured_s, 3), "links": links, "flows": flows,
               "metrics": metrics, "cpu_idle_pct": judged["cpu_idle_pct"],
               "t_window_start": round(window.sampler.t0 + window.t_start, 6),
               "outputs": outputs}
        out.update(d.lossless)      # pfcd's counters, who feeds whom, the classes' counts
        # another job's ranks and its incast's hosts: the jobs beside the one diagnosed
        others = [*(pp["other_job"]["hosts"] if ph.oconns else []),
                  *(pp["incast"]["from"] + [pp["incast"]["to"]] if ph.iconns else [])]
        out["scheduler"] = scheduler_map(ph.hosts, others, pp["storage"]["hosts"])
        if ph.oconns:
            t0 = d.window.sampler.t0
            starts = [o["t_ready"] for o in outputs if o.get("t_ready") is not None]
            metrics["other_job"] = {
                "hosts": ph.pp["other_job"]["hosts"],
                **otherjob.summary([load(work / "other" / f"rank{r}.json")
                                    for r in range(len(ph.pp["other_job"]["hosts"]))],
                                   max(starts) if starts else None, t0 + d.t_job_end)}
        if planning.step_parts_recorded(pp["job"]) and (
                pp["loader"]["enabled"] or pp["job"]["transport"] == "roce"):
            ranks = gpuwait.rank_details(outputs)
            metrics["gpu_wait"] = gpuwait.summary(ranks)
            # what each storage host served: its batches' bytes are the loaders' bytes
            out["gpu_wait"] = {"ranks": ranks, "storage": {
                srv: load(work / f"storage-{srv}.json") for srv in pp["storage"]["hosts"]}}
        return out

    def settings_used(self, ph: Phase, outputs: list[dict[str, Any]],
                      flows: list[dict[str, Any]]) -> dict[str, Any]:
        """What the phase ran with, beside what it measured: the library, program, transport,
        congestion control, paths and pins, placement and hosts (the GPU-wait diagnosis
        reads none of them: ``lab.analysis.gpuwait.SETTING_ECHOES``)."""
        pp = ph.pp
        by_tuple = {(f["src_ip"], f["sport"], f["dst_ip"], f["dport"]): f["id"] for f in flows}
        out = {"library": pp["job"]["library"], "program": pp["job"]["program"],
               "transport": pp["job"]["transport"], "cc": pp["job"]["cc"],
               "paths": pp["placement"]["paths"],
               "pins": [{"flow": by_tuple.get((p["src"], p["sport"], p["dst"], p["dport"])),
                         "switch": p["switch"], "port": p["port"]} for p in ph.pinned],
               "placement": pp["placement"]["hosts"], "hosts": ph.hosts}
        if ph.subconns and pp["job"]["transport"] == "mptcp":
            out["subflows"] = pp["job"]["subflows"]
        elif ph.subconns:
            out["spray"] = {"ports": pp["roce"]["spray"], "receivers": pp["roce"]["placement"]}
        if pp["job"]["library"] == "gloo":
            out["gloo"] = self.gloo_summary(ph, outputs, flows)
        return out

    def roce_metrics(self, ph: Phase, outputs: list[dict[str, Any]],
                     links: list[dict[str, Any]]) -> dict[str, Any]:
        """A ring on RoCE: what its receivers saw out of order; sprayed (or on MPTCP's
        subflows), how the first rank's leaf split the job's 5-tuples over the uplinks."""
        out: dict[str, Any] = {}
        if ph.pp["job"]["transport"] == "roce":
            out["reordering"] = self.ring_reordering(outputs)
        if ph.subconns:
            leaf = self.leaf_of[ph.hosts[0]]
            out["split"] = {"switch": leaf,
                            **uplinks.split(uplinks.of(links, self.topo, leaf))}
        return out

    @staticmethod
    def gloo_summary(ph: Phase, outputs: list[dict[str, Any]],
                     flows: list[dict[str, Any]]) -> dict[str, Any]:
        """What gloo was and did: torch's version, the algorithm it runs for an all_reduce
        and the one its bytes show, its connections per rank pair."""
        n = len(ph.hosts)
        per_epoch: dict[int, int] = {}
        for st in (outputs[0].get("steps") or []) if outputs else []:
            per_epoch[int(st["epoch"])] = per_epoch.get(int(st["epoch"]), 0) + 1
        return {"torch": next((o.get("torch") for o in outputs if o.get("torch")), None),
                "algorithm": next((o.get("algorithm") for o in outputs
                                   if o.get("algorithm")), None),
                "seen": gloo.algorithm_seen(flows, n, ph.pp["job"]["size_bytes"], per_epoch),
                "connections_per_pair": gloo.connections_per_pair(ph.conns, n)}

    def mark_mgmt_flows(self, flows: list[dict[str, Any]]) -> None:
        """Flows between management addresses crossed the management LAN's one switch:
        their path is that switch and their ``interface`` says so. It is a plain L2 bridge
        that counts ports, not flows, so their switch-counted bytes stay 0; the LAN's ports
        (in the phase's links) and the ends' own counts (``sent_bytes`` of a ring hop,
        ``received_bytes`` of a loader connection) say what they carried."""
        mgmt = self.topo.get("mgmt") or {}
        ips = {h["ip"] for h in mgmt.get("hosts", [])}
        for f in flows:
            f["interface"] = "mgmt" if f["src_ip"] in ips else "fabric"
            if f["interface"] == "mgmt":
                f["path"] = [sw["name"] for sw in mgmt["switches"]]

    @staticmethod
    def fidelity_window(outputs: list[dict[str, Any]], d: Drive) -> tuple[float, float]:
        """The job's steps: from when its last worker passed the start barrier to its last
        step's end, on the sampler's clock.

        Starting a dozen Python programs on two cores, and their exit, are the lab's set-up
        and teardown, not emulation; under TCG either takes seconds of both vCPUs.
        """
        t0 = d.window.sampler.t0
        t_ready = [o["t_ready"] - t0 for o in outputs if o.get("t_ready") is not None]
        t_fid = min(max([d.window.t_start, *t_ready]), d.t_job_end)
        ends = [st["t_end"] - t0 for o in outputs for st in o.get("steps") or []
                if isinstance(st, dict) and st.get("t_end") is not None]
        t_fid_end = min(max([t_fid, *ends]), d.t_job_end) if ends else d.t_job_end
        return t_fid, t_fid_end

    def read_outputs(self, pp: dict[str, Any], hosts: list[str], conns: list[Conn],
                     work: Path) -> list[dict[str, Any]]:
        if pp["job"]["pattern"] == "ring":
            return [load(work / f"rank{r}.json") for r in range(len(hosts))]
        return [load(work / "sink.json")] + [load(work / f"{c.spec.id}.json") for c in conns]

    def attach_results(self, conns: list[Conn], outputs: list[dict[str, Any]]) -> None:
        """Each connection's TCP_INFO (as its sender saw it) onto its flow."""
        info = {}
        for out in outputs:
            for c in out.get("connections", []):
                info[(c.get("sport"), c.get("dport"), c.get("src"))] = c
        for c in conns:
            got = info.get((c.spec.sport, c.spec.dport, c.spec.src_ip), {})
            span = (got.get("t_close") or 0) - (got.get("t_open") or 0)
            c.spec.result = {"retransmits": got.get("retransmits", 0),
                             "sent_bytes": got.get("bytes_acked", 0),
                             # over the connection's life: compute gaps included
                             "goodput_bps": got.get("bytes_acked", 0) * 8 / span
                             if span > 0 else 0.0,
                             "error": None}

    @staticmethod
    def attach_loader_results(lconns: list[Conn], outputs: list[dict[str, Any]]) -> None:
        """Each loader connection's bytes as its receiving end counted them: the rank's
        TCP_INFO ``bytes_received`` of each worker's connection, matched by its 5-tuple
        seen from the rank. On the fabric the switches count the same bytes (with their
        headers); on the management LAN, whose bridge counts no flow, only the ends do."""
        got = {(w.get("src"), w.get("sport")): w for o in outputs
               for w in (o.get("loader") or {}).get("per_worker") or []}
        for c in lconns:
            w = got.get((c.spec.dst_ip, c.spec.dport), {})
            c.spec.result = {"received_bytes": w.get("bytes_received", 0), "error": None}

    @staticmethod
    def attach_client_results(sconns: list[Conn], work: Path) -> None:
        """Each storage client's reads and checkpoints as it counted them (its record: the
        bytes it received, the checkpoint bytes the server acknowledged) on its two
        connections' flows: what says they carried anything where no switch counts flows."""
        for c in sconns:
            rec = load(work / f"client{c.rank}.json")
            c.spec.result = ({"received_bytes": rec.get("read_bytes") or 0, "error": None}
                             if c.spec.kind == "storage-read" else
                             {"sent_bytes": sum(k.get("bytes", 0)
                                                for k in rec.get("checkpoints") or []),
                              "error": None})

    def phase_metrics(self, pp: dict[str, Any], hosts: list[str],
                      outputs: list[dict[str, Any]], flows: list[dict[str, Any]],
                      links: list[dict[str, Any]], work: Path,
                      stalls: list[str]) -> dict[str, Any]:
        """The job's numbers; ``errors`` are the ranks' and why a hung job hung."""
        job = pp["job"]
        job_flows = [f for f in flows if f["kind"] in ("allreduce", "incast")]
        if job["pattern"] == "ring":
            checkpoints = None
            if pp["storage"]["mode"] != "off":
                checkpoints = [(c["t_start"], c["t_end"]) for r in range(len(hosts))
                               for c in load(work / f"client{r}.json").get("checkpoints", [])]
            mt = jm.ring_metrics(outputs, len(hosts), max(job["sizes"] or [job["size_bytes"]]),
                                 self.bottleneck_bps(job_flows), job_flows, checkpoints)
            if job["sizes"]:
                mt["sweep"] = jm.sweep_rows(outputs, len(hosts), self.bottleneck_bps(job_flows))
            if job["program"] == "ddp":
                mt["ddp"] = jm.ddp_metrics(outputs)
        else:
            rx = job_flows[0]["dst"]
            rate = self.bw[(self.leaf_of[rx], rx)]
            mt = jm.incast_metrics(outputs[0], len(job_flows), job["size_bytes"]
                                   // len(job_flows), job["compute_s"], rate, job["warmup"])
        qports = pp["ecn"]["ports"] or self.hot_ports(links)
        mt["queues"] = {ln["intf"]: {"max_bytes": max(ln["series"]["queue_bytes"], default=0),
                                     "delay_ms": jm.queue_delay_ms(ln["series"]["queue_bytes"],
                                                                   ln["bw_mbps"] * 1e6),
                                     "drops": ln["drops"], "ce_marked": ln.get("ce_marked", 0)}
                        for ln in links if ln["intf"] in qports}
        mt["drops"] = sum(ln["drops"] for ln in links)
        mt["errors"] = stalls + [o["error"] for o in outputs if o.get("error")]
        return mt

    @staticmethod
    def hot_ports(links: list[dict[str, Any]], n: int = 3) -> list[str]:
        return [ln["intf"] for ln in sorted(links, key=lambda ln: -ln["util_mean"])[:n]]
