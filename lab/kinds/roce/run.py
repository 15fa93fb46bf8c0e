"""The roce kind's run: the fabric up, traffic classes on every port, then each phase's
marking, PFC and RoCE flows inside one measurement window.

Per phase, in this order: ECN marking on the switches' ports (the controller's marker);
every QP watched on every switch; PFC started (the controller runs ``pfcd``,
``controllers.pfc``); each receiver's ``roce_bw`` server; the window opened; each sender's
``roce_bw`` client at its start time; the clients' exit (each waits for its last message's
completion); the window closed once the queues drained; the servers stopped; PFC stopped
(only now: a paused host queue let go unpaused would flood the switch); every per-class
leaf read again.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controllers import cbuild
from lab.agents import roce as roce_agent
from lab.kinds.base import PhaseCounts, Plan, Progress, bring_up
from lab.kinds.roce import metrics
from lab.kinds.roce import plan as planning
from lab.kinds.roce.plan import RoceFlow
from lab.machine import programs
from lab.machine.progress import Ticker
from lab.measure import classes as class_counts
from lab.measure import headroom, telemetry
from lab.measure.result import flow_entries
from lab.measure.window import Window
from lab.model.errors import MachineError
from lab.net.lossless import LosslessClass
from lab.workloads import rocebw
from lab.workloads.traffic import FlowRunner

if TYPE_CHECKING:
    from lab.net.fabric import Fabric


def prepare(_plan: Plan) -> Path:
    """``roce_bw`` built (clang, cached by source digest) before anything starts: a
    compiler's refusal is one line, not a half-started fabric."""
    try:
        return cbuild.build("roce_bw", roce_agent.ROCE_BW)
    except ValueError as exc:
        raise MachineError("roce_bw", str(exc)) from None


def on_fabric(plan: Plan, fabric: Fabric, progress: Progress,
              binary: Path) -> dict[str, Any]:
    """Bring the fabric up, give every port its traffic classes, run each phase; the kind's
    part of result.json."""
    loss = bring_up(plan, fabric, progress)
    run = RoceRun(plan, fabric, progress, binary)
    run.lossless.classes_on(next(iter(planning.phase_params(plan.params).values())))
    phases = {}
    for name, pp in planning.phase_params(plan.params).items():
        progress(f"[{plan.policy_label}] phase {name}: {describe(pp)}")
        phases[name] = run.phase(name, pp)
    return metrics.assemble(plan, phases, loss)


def describe(pp: dict[str, Any]) -> str:
    pfc = "PFC" if pp["pfc"]["enabled"] else "no PFC"
    ecn = "ECN (RED)" if pp["ecn"]["marking"] == "red" else "no marking"
    r = pp["roce"]
    spray = (f", sprayed over {r['spray']} ports, {r['placement']} receivers"
             if r["spray"] > 1 else "")
    return f"{pfc}, {ecn}, congestion control {r['cc']}{spray}"


class RoceRun:
    """The run's fabric and what its phases share: the binary, the ports, the marking."""

    def __init__(self, plan: Plan, fabric: Fabric, progress: Progress, binary: Path) -> None:
        self.plan, self.fabric, self.progress, self.binary = plan, fabric, progress, binary
        self.topo = plan.topo_desc
        self.ports = telemetry.fabric_ports(self.topo)
        self.bridges = [s["name"] for s in self.topo["switches"]]
        self.marked: set[str] = set()
        self.flows = [f for f in plan.flows if isinstance(f, RoceFlow)]
        # every 5-tuple of the run (QPs, then sprayed QPs' subflows): its switch counters'
        # index, distinct across the run's phases
        specs = [f.flow for f in self.flows] + [s for f in self.flows for s in f.subflows]
        self.index = {id(s): i for i, s in enumerate(specs)}
        self.hosts = {h["name"] for h in self.topo["hosts"]}
        self.lossless = LosslessClass(fabric, self.topo, self.request)

    def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The controller's answer (its ``request`` raises on a refusal)."""
        assert self.fabric.controller is not None
        return self.fabric.controller.request(msg)

    def set_marking(self, pp: dict[str, Any]) -> dict[str, Any] | None:
        """RED-like marking of every switch port (the lossless class's queue is the
        port's watched one), or none; a port marked before and not now is turned off."""
        e = pp["ecn"]
        body = ({"kmin_bytes": e["kmin_bytes"], "kmax_bytes": e["kmax_bytes"],
                 "pmax": e["pmax"]} if e["marking"] == "red" else None)
        want = {p.intf for p in self.ports} if body else set()
        todo = [{"intf": i, **body} for i in sorted(want)] if body else []
        todo += [{"intf": i, "off": True} for i in sorted(self.marked - want)]
        if todo:
            self.request({"cmd": "ecn", "ports": todo})
        self.marked = want
        return body

    def ecn_counters(self) -> dict[str, dict[str, int]]:
        if not self.marked:
            return {}
        return self.request({"cmd": "ecn_stats"}).get("ports", {})

    # -- a phase ---------------------------------------------------------------------------
    def phase(self, name: str, pp: dict[str, Any]) -> dict[str, Any]:
        """One phase from its settings to its counters."""
        flows = [f for f in self.flows if f.phase == name]
        specs = [s for f in flows for s in f.specs()]
        work = self.fabric.run_dir / "roce" / name
        work.mkdir(parents=True, exist_ok=True)
        marking = self.set_marking(pp)
        watch = [e for s in specs for e in s.watch_entries(self.index[id(s)])]
        if watch:
            self.request({"cmd": "watch", "flows": watch})
        sampler = telemetry.Sampler(self.ports, hz=telemetry.SAMPLE_HZ,
                                    controller=self.fabric.controller, classes=self.fabric.cpu)
        window = Window(sampler, self.ports, self.bridges, name=name)
        d = self.drive(name, pp, flows, window, work)
        judged = window.judge(window.t_start, d["t_end"])
        roce = [f for f in flows if f.transport == "roce"]
        outputs = rocebw.read_outputs([f.flow for f in roce], work)
        for f in roce:
            f.flow.result = rocebw.flow_result(outputs[f.flow.id])
        fentries = flow_entries(specs, window.flow_deltas(), self.topo,
                                [self.index[id(s)] for s in specs])
        links = window.links()
        for ln in links:
            c0, c1 = d["ecn0"].get(ln["intf"], {}), d["ecn1"].get(ln["intf"], {})
            ln["ce_marked"] = c1.get("ce_marked", 0) - c0.get("ce_marked", 0)
        details = {"duration_s": round(window.measured_s, 3), "links": links,
                   "flows": fentries, "classes": d["leaves"], "pfc": d["pfc"],
                   "pfc_feeders": self.lossless.feeders(pp),
                   "marking": marking, "transport": outputs}
        pm = metrics.phase_metrics(pp, flows, details, self.topo, self.plan.policy,
                                   int(self.plan.params["seed"]))
        # A QP that went to the error state (its retries exhausted) is what the network did
        # to it, counted in the metrics; a program without a result is a measurement lost.
        errors = [f"{i}: {o['error']}" for i, o in outputs.items() if o.get("missing")]
        errors += [f"{f.flow.id}: {f.flow.result['error']}" for f in flows
                   if f.transport == "tcp" and f.flow.result.get("error")]
        valid = headroom.cpu_verdict(judged) is None and not errors
        return {"counts": PhaseCounts(
            duration_s=details["duration_s"], links=links, flows=fentries,
            cpu_idle_min_pct=judged["cpu_idle_min_pct"], lab_cpu_pct=judged["lab_cpu_pct"],
            valid=valid, details=details, cpu=headroom.cpu_fields(judged)),
            "metrics": pm, "errors": errors}

    def drive(self, name: str, pp: dict[str, Any], flows: list[RoceFlow], window: Window,
              work: Path) -> dict[str, Any]:
        """PFC on (if the phase asks), the servers, the window open, every client to its
        end, the window closed, then PFC off; the counters read around it. Whatever it
        started is stopped, also on failure."""
        roce = [f for f in flows if f.transport == "roce"]
        tcp = FlowRunner(self.fabric, [f.flow for f in flows if f.transport == "tcp"], work,
                         self.fabric.record)
        ends = self.lossless.devices()
        servers: list[subprocess.Popen] = []
        clients: list[tuple[RoceFlow, subprocess.Popen]] = []
        d: dict[str, Any] = {"pfc": None}
        try:
            if pp["pfc"]["enabled"]:
                self.lossless.pfc_on(pp)
            leaves0 = class_counts.leaf_counters(ends)
            rates = {ln["a"]: ln["bw_mbps"] for ln in self.topo["links"]
                     if ln["a"] in self.hosts}
            for f in roce:
                if f.spray > 1:
                    rocebw.warm(self.fabric, f.flow, f.spray)
            servers = rocebw.start_servers(self.fabric, self.binary,
                                           {f.flow.dst: rates[f.flow.dst] for f in roce}, work,
                                           pp["roce"]["placement"],
                                           pp["roce"]["reorder_pkts"])
            tcp.start_servers()
            window.sampler.start()
            window.open()
            d["ecn0"] = self.ecn_counters()
            duration = float(pp["duration"])
            tcp.start_clients(duration)
            clients = self.run_clients(name, roce, pp, work)
            tcp.wait(timeout_s=duration + 15)
            d["t_end"] = time.monotonic() - window.sampler.t0
            window.close()
            d["ecn1"] = self.ecn_counters()
            for s in servers:
                s.send_signal(signal.SIGTERM)
            for s in servers:
                s.wait(timeout=10)
            d["pfc"] = self.lossless.pfc_off()
            d["leaves"] = class_counts.delta(leaves0, class_counts.leaf_counters(ends))
        finally:
            for p in [*servers, *(c for _, c in clients)]:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            tcp.stop()
            self.lossless.pfc_off()
            window.sampler.stop()
        tcp.collect()
        return d

    def run_clients(self, name: str, flows: list[RoceFlow], pp: dict[str, Any],
                    work: Path) -> list[tuple[RoceFlow, subprocess.Popen]]:
        """Each flow's client at its start time; returns once every client has exited."""
        r, duration = pp["roce"], float(pp["duration"])
        started: list[tuple[RoceFlow, subprocess.Popen]] = []
        t0 = time.monotonic()
        self.progress(f"[{self.plan.policy_label}] {name}: {len(flows)} QPs for "
                      f"{duration:g} s ...")
        with Ticker(duration, f"[{self.plan.policy_label}] {name}"):
            for f in sorted(flows, key=lambda x: x.start_s):
                time.sleep(max(0.0, t0 + f.start_s - time.monotonic()))
                argv = rocebw.client_argv(self.binary, f.flow, r, duration - f.start_s,
                                          work / f"{f.flow.id}.json")
                started.append((f, programs.spawn(
                    self.fabric, f.flow.src, argv, work / f"{f.flow.id}.log",
                    f"roce_bw client {f.flow.id}", "traffic")))
            drain = 1 + r["rto_ms"] / 1000 * 8
            for _, p in started:
                try:
                    p.wait(timeout=max(1.0, t0 + duration + drain + 10 - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.send_signal(signal.SIGTERM)
                    p.wait(timeout=10)
        return started
