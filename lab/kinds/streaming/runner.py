"""The streaming kind's run: the edge brought up (fabric, FRR routers, BGP), the phases one
after another on it, and the logs kept afterwards."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab.kinds.base import Plan, Progress
from lab.kinds.streaming.edgerun import EdgeRun
from lab.kinds.streaming.metrics import assemble, phase_line, phase_metrics
from lab.kinds.streaming.streamplan import phase_names
from lab.model.errors import MachineError
from lab.net.edge import CORE

if TYPE_CHECKING:
    from lab.net.fabric import Fabric


def run(plan_: Plan, fabric: Fabric, progress: Progress, _prepared: Any = None) -> dict[str, Any]:
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
            progress(f"[{phase}] " + phase_line(phase_metrics(phases[phase])))
    finally:
        edge.sampler.stop()
        edge.rsampler.stop()
    bgp_after = edge.bgp_state()
    return assemble(plan_, phases, bgp, bgp_after, timings, wan)


def keep_logs(work: Path, out_dir: Path) -> None:
    """The routers' logs and the streams' JSON (the controller's log is kept by every run)."""
    for log in work.glob("*/*.log"):
        (out_dir / "frr" / log.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(log, out_dir / "frr" / log.parent.name / log.name)
    if (work / "streams").is_dir():
        shutil.copytree(work / "streams", out_dir / "streams", dirs_exist_ok=True)
