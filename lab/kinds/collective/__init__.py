"""The collective kind: GPUs waiting for the network, a synthetic data-parallel job phase by
phase on one fabric.

``plan`` checks the scenario and plans connections, ``run`` drives the job on the fabric,
``metrics`` turns the workers' records into nccl-tests-style numbers.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab.analysis import diagnose
from lab.kinds.base import Plan, Progress, bring_up
from lab.kinds.collective import jobplan as kind
from lab.kinds.collective import metrics as jm
from lab.kinds.collective.jobplan import DEFAULTS, SCHEMA, plan
from lab.kinds.collective.metrics import phase_line
from lab.kinds.collective.plots import run_plots
from lab.kinds.collective.runner import RECEIVER_CC, JobRun, read_proc
from lab.machine import environment
from lab.measure import telemetry
from lab.model.errors import MachineError
from lab.model.result import SCHEMA_VERSION

if TYPE_CHECKING:
    from lab.net.fabric import Fabric

__all__ = ["DEFAULTS", "SCHEMA", "analyse", "keep_logs", "plan", "prepare", "regress_metrics",
           "run", "run_plots", "summary_rows"]


def analyse(result: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The job's metrics are made while it runs (per phase): nothing to add afterwards."""
    return result["metrics"]


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for name, mt in result["metrics"]["phases"].items():
        rows.append((name, phase_line(mt)))
        if mt.get("sweep"):
            rows += [("", line) for line in jm.sweep_table(mt["sweep"])]
    return rows + list((result["metrics"].get("phases_skipped") or {}).items())


def prepare(plan_: Plan) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Every phase's parameters, and the phases this machine cannot run (and why); refuses
    a congestion control or a marking the machine cannot give, before anything starts."""
    phases_pp = kind.check(plan_.params, plan_.topo_desc)
    skipped = kind.phases_to_skip(plan_.params, phases_pp, plan_.env.congestion_controls)
    phases_pp = {n: pp for n, pp in phases_pp.items() if n not in skipped}
    gloo_phases = kind.uses_gloo(phases_pp)
    if gloo_phases:
        lib = environment.collective_library()
        if not lib["torch"]:
            raise MachineError("job.library", f"gloo needs PyTorch: {environment.TORCH_MISSING}"
                               f" (phase {gloo_phases[0]})")
        if not lib["gloo"]:
            raise MachineError("job.library", f"PyTorch {lib['torch']} has no gloo backend "
                               f"(phase {gloo_phases[0]})")
    for name, pp in phases_pp.items():
        if pp["job"]["cc"] in RECEIVER_CC:
            allowed = read_proc("/proc/sys/net/ipv4/tcp_allowed_congestion_control").split()
            if pp["job"]["cc"] not in allowed:
                raise MachineError("job.cc", f"{pp['job']['cc']} is in this kernel but not "
                                   "allowed in network namespaces (net.ipv4.tcp_allowed_"
                                   "congestion_control; `make setup` allows every available "
                                   f"one); phase {name}")
        if kind.check_marking(pp["ecn"], "ecn") and plan_.env.ecn == "none":
            raise MachineError("ecn.marking", "this machine has no ECN marking mechanism "
                               "(RED, or clang and bpftool for the tc-BPF marker)")
    return phases_pp, skipped


def run(plan_: Plan, fabric: Fabric, progress: Progress,
        prepared: tuple[dict[str, dict[str, Any]], dict[str, str]]) -> dict[str, Any]:
    """Bring the fabric up, then the job's phases one after another on it."""
    phases_pp, skipped = prepared
    phases: dict[str, Any] = {}
    loss = bring_up(plan_, fabric, progress)
    job = JobRun(plan_, fabric, progress)
    for name, pp in phases_pp.items():
        t0 = time.monotonic()
        phases[name] = job.run_phase(name, pp)
        fabric.timings[f"phase_{name}_s"] = time.monotonic() - t0
        progress(f"[{name}] " + jm.phase_line(phases[name]["metrics"]))
    return assemble(plan_, phases, loss, {}, skipped)


def keep_logs(work: Path, out_dir: Path) -> None:
    """The workers' and storage programs' records and logs (captures stay behind)."""
    if (work / "job").is_dir():
        shutil.copytree(work / "job", out_dir / "job", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.pcap"))


def assemble(plan_: Plan, phases: dict[str, Any], loss: float,
             timings: dict[str, Any], skipped: dict[str, str] | None = None) -> dict[str, Any]:
    """result.json: top-level links, flows and metrics are the first phase's (the problem
    the scenario shows); ``metrics.phases`` and ``phase_details`` hold every phase that ran,
    ``metrics.phases_skipped`` why the others did not."""
    skipped = skipped or {}
    first = next(iter(phases))
    main = phases[first]
    metrics = dict(main["metrics"])
    metrics["phases"] = {n: p["metrics"] for n, p in phases.items()}
    metrics["pingall_loss_pct"] = loss
    metrics["phases_skipped"] = dict(skipped)
    notes = list(plan_.env.notes)
    notes += [f"{n}: {why}" for n, why in skipped.items()]
    for n, p in phases.items():
        m = p["metrics"]
        if m["cpu_idle_min_pct"] < telemetry.MIN_CPU_IDLE_PCT:
            notes.append(f"{n}: CPU-bound ({m['cpu_idle_min_pct']:.0f}% idle)")
        notes += [f"{n}: {e}" for e in m["errors"]]
    result: dict[str, Any] = {
        "schema": SCHEMA_VERSION, "kind": "collective", "scenario": plan_.scenario.name,
        **plan_.policy_fields(), "seed": int(plan_.params["seed"]),
        "duration_s": main["duration_s"], "phase": first,
        "environment": plan_.env.as_result(), "topology": plan_.topo_desc,
        "params": plan_.params, "links": main["links"], "flows": main["flows"],
        "metrics": metrics, "timings": timings,
        "phase_details": {n: {k: p[k] for k in ("duration_s", "links", "flows", "cpu_idle_pct")}
                          for n, p in phases.items()},
        "fidelity": {"cpu_idle_min_pct": min(p["metrics"]["cpu_idle_min_pct"]
                                             for p in phases.values()),
                     "lab_cpu_pct": telemetry.worst_lab_cpu_pct(
                         p["metrics"]["lab_cpu_pct"] for p in phases.values()),
                     "valid": loss == 0 and all(p["metrics"]["fidelity_valid"]
                                                for p in phases.values()),
                     "notes": notes, "step_clock": "time.monotonic (ns resolution)"},
    }
    result["fidelity"]["datapath_loss_bytes"] = diagnose.unexplained_loss(result)
    return result


def regress_metrics(result: dict[str, Any]) -> dict[str, float]:
    """Per hashed phase (a placed phase's paths are the lab's, no policy's): step p99, GPU
    idle share and drops."""
    out = {}
    for name, mt in result["metrics"]["phases"].items():
        if mt.get("paths") != "hash":
            continue
        for key in ("step_p99_s", "gpu_idle_fraction", "drops"):
            out[f"{name}.{key}"] = float(mt[key])
    return out
