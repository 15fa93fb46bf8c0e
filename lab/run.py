"""One scenario run, from validated input to result.json, with teardown on every exit path.

Everything that can be checked is checked before anything is started: the scenario, every
``--set``, the policy, the topology, the machine. Only then is the lab locked, the run
recorded and the fabric brought up. Normal exit, an exception, Ctrl-C and SIGTERM all pass
through the same teardown; ``kill -9`` leaves a record that ``fabriclab clean`` applies.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controllers import policies
from lab import diagnose, environment, faults, kinds, scenario, state, telemetry
from lab.errors import MachineError, ScenarioError
from lab.fabric import Fabric
from lab.progress import Ticker
from lab.result import SCHEMA_VERSION, flow_entries, link_entries, validate
from lab.topologies import build_defaults, describe, make_topology, refuse_without_netem
from lab.traffic import FlowRunner, FlowSpec

#: A phase whose least idle second had less CPU to spare than this ran CPU-bound: its
#: numbers describe the emulator, not the network, and are flagged invalid.
MIN_CPU_IDLE_PCT = 10.0
SAMPLE_HZ = 10.0

Progress = Callable[[str], None]


def require_root() -> None:
    if os.geteuid() != 0:
        raise MachineError("user", "fabriclab must run as root: it creates namespaces, "
                           "veths and OVS bridges (try: sudo fabriclab ...)")


@dataclass
class Plan:
    """A fully validated run: nothing has been started yet."""

    scenario: scenario.Scenario
    kind: Any
    params: dict[str, Any]
    policy: str
    topo_desc: dict[str, Any]
    flows: list[FlowSpec]
    env: environment.Environment
    runtime: str

    def topology(self):
        return make_topology(self.params["topology"])

    @property
    def policy_label(self) -> str:
        """The policy's name: what results, directories and progress lines call it.

        ``policy`` itself may be a user's ``file.py:Class``, which is what the controller
        must be given but is no name for a directory.
        """
        return policies.resolve(self.policy).name

    def policy_fields(self) -> dict[str, str]:
        """``policy`` (and ``policy_file`` for a user's policy) for result.json."""
        fields = {"policy": self.policy_label}
        if policies.is_file_spec(self.policy):
            fields["policy_file"] = self.policy
        return fields


def policy_names(wanted: str) -> list[str]:
    """The policies ``wanted`` means (``all``, a name, or ``file.py[:Class]``), checked."""
    if wanted == "all":
        return policies.available()
    try:
        policies.resolve(wanted)
    except policies.PolicyFileError as exc:
        raise ScenarioError("policy-file", str(exc).split(": ", 1)[-1]) from None
    except policies.UnknownPolicy as exc:
        raise ScenarioError("policy", str(exc).split(": ", 1)[-1]) from None
    return [wanted]


@dataclass
class CheckedInput:
    """A scenario with every ``--set`` and override applied and checked; no machine yet."""

    scenario: scenario.Scenario
    kind: Any
    params: dict[str, Any]
    topo_desc: dict[str, Any]
    flows: list[Any]
    policies: list[str]


def check_input(name: str, policy: str | None = None, sets: list[str] | None = None,
                duration: float | None = None, seed: int | None = None) -> CheckedInput:
    """Every check of the user's input that needs neither root nor the machine.

    Kept apart from ``make_plans`` so bad input is refused (one ``LabError`` naming its
    field) before the machine is looked at, and so it can be tested, fuzzed included,
    without root or emulation.
    """
    sc = scenario.load(name)
    kind = kinds.get(sc.kind)
    params = scenario.apply_sets(sc.params, scenario.parse_set(sets or []), kind.SCHEMA)
    if policy is not None:
        params["policy"] = policy
    if duration is not None:
        params["duration"] = duration
    if seed is not None:
        params["seed"] = seed
    params.setdefault("policy", "all")
    params.setdefault("seed", 1)
    params.setdefault("duration", 10.0)
    if params["policy"] != "all":
        policy_names(str(params["policy"]))
    scenario.validate(params, kind.SCHEMA)
    params["rate_scale"] = float(params.get("rate_scale", environment.vm_rate_scale()))
    if params["rate_scale"] != 1.0:
        topo = params.get("topology", {})
        defaults = {**getattr(kind, "DEFAULTS", {}),
                    "topology": build_defaults(topo if isinstance(topo, dict) else {})}
        params = scenario.scale_rates(params, params["rate_scale"], defaults)
    topo_desc = describe(make_topology(params.get("topology", {})))
    flows = kind.plan(topo_desc, params, random.Random(params["seed"]))
    return CheckedInput(sc, kind, params, topo_desc, flows,
                        policy_names(str(params["policy"])))


def make_plans(name: str, policy: str | None = None, sets: list[str] | None = None,
               duration: float | None = None, seed: int | None = None,
               runtime: str | None = None) -> list[Plan]:
    """Validate everything and return one plan per policy to run."""
    given = check_input(name, policy, sets, duration, seed)
    require_root()
    env = environment.detect(runtime)
    if env.datapath == "user" and not env.userspace_tso:
        raise MachineError("ovs", "; ".join(env.notes) or "userspace TSO is off")
    refuse_without_netem(given.topo_desc, env.netem)
    chosen = environment.pick_runtime(env.runtimes, runtime)
    return [Plan(given.scenario, given.kind, given.params, p, given.topo_desc, given.flows,
                 env, chosen)
            for p in given.policies]


def default_out_dir(scenario_name: str) -> Path:
    return Path("results") / f"{scenario_name}-{time.strftime('%Y%m%d-%H%M%S')}"


@contextmanager
def fabric_session(label: str, topo: Any, env: environment.Environment, runtime: str,
                   policy: str, seed: int) -> Iterator[Fabric]:
    """Lock the lab, record the run, yield an unstarted fabric; tear down on any exit."""
    lock = state.LabLock()
    lock.acquire()
    run_id = f"{label}-{int(time.time() * 1000)}-{os.getpid()}"
    # Every process the lab spawns inherits this marker: `clean` finds them by it.
    os.environ[state.RUN_ENV] = run_id
    record = state.RunRecord.new(run_id)
    work = state.STATE_DIR / "work" / run_id
    work.mkdir(parents=True, exist_ok=True)
    record.paths.append(str(work))
    record.save()
    fabric = Fabric(topo, env, runtime, policy, seed, work, record)
    try:
        with state.signals_as_exit():
            yield fabric
    finally:
        fabric.stop()
        lock.release()
        os.environ.pop(state.RUN_ENV, None)


def execute(plan: Plan, out_dir: Path, progress: Progress = print) -> dict[str, Any]:
    """Run one plan on a fresh fabric; returns the result (also written to out_dir)."""
    if hasattr(plan.kind, "execute"):          # a kind with phases of its own
        return plan.kind.execute(plan, out_dir, progress)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_run = time.monotonic()
    with fabric_session(f"{plan.scenario.name}-{plan.policy_label}", plan.topology(), plan.env,
                        plan.runtime, plan.policy, int(plan.params["seed"])) as fabric:
        try:
            loss = bring_up(plan, fabric, progress)
            result = _traffic_phase(plan, fabric, progress)
        finally:
            _keep_logs(fabric.run_dir, out_dir)
    result["metrics"]["pingall_loss_pct"] = loss
    if loss > 0:
        result["fidelity"]["valid"] = False
        result["fidelity"]["notes"].append(f"pingall lost {loss:.0f}% before traffic")
    result["timings"] = {k: round(v, 3) for k, v in fabric.timings.items()}
    result["timings"]["wall_s"] = round(time.monotonic() - t_run, 3)
    write_result(result, out_dir)
    return result


def bring_up(plan: Plan, fabric: Fabric, progress: Progress) -> float:
    """Start the fabric and ping all pairs, saying so; returns the pingall loss in %."""
    progress(f"[{plan.policy_label}] bringing up {plan.topo_desc['type']} "
             f"({len(plan.topo_desc['switches'])} switches, "
             f"{len(plan.topo_desc['hosts'])} hosts), controller {plan.runtime}")
    fabric.start()
    loss = fabric.pingall()
    progress(f"[{plan.policy_label}] up in {fabric.timings['ready_s']:.1f} s; "
             f"pingall loss {loss:.0f}%")
    return loss


def write_result(result: dict[str, Any], out_dir: Path) -> None:
    """Hold the result to schema 1, then write it: an invalid result is never written."""
    problems = validate(result)
    if problems:
        raise MachineError("result", "; ".join(problems))
    # When the run finished, in UTC: reports and comparisons date a run by it, not by the
    # file's modification time, which a copy resets.
    result.setdefault("finished", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    (out_dir / "result.json").write_text(json.dumps(result, indent=1))


def _keep_logs(work: Path, out_dir: Path) -> None:
    """Copy the controller log and iperf3 JSON out of the work dir before it is removed."""
    if (work / "controller.log").exists():
        shutil.copy(work / "controller.log", out_dir / "controller.log")
    if (work / "iperf3").is_dir():
        shutil.copytree(work / "iperf3", out_dir / "iperf3", dirs_exist_ok=True)


def _traffic_phase(plan: Plan, fabric: Fabric, progress: Progress) -> dict[str, Any]:
    assert fabric.controller is not None
    duration = float(plan.params["duration"])
    watch = [e for i, f in enumerate(plan.flows) for e in f.watch_entries(i)]
    fabric.controller.request({"cmd": "watch", "flows": watch})
    planned_faults = faults.parse(plan.params.get("faults"), plan.topo_desc, duration)
    runner = FlowRunner(fabric, plan.flows, fabric.run_dir, fabric.record,
                        interval_s=faults.INTERVAL_S if planned_faults else None)
    ports = telemetry.fabric_ports(plan.topo_desc)
    sampler = telemetry.Sampler(ports, hz=SAMPLE_HZ, controller=fabric.controller)
    bridges = [s["name"] for s in plan.topo_desc["switches"]]
    injector = faults.Injector(planned_faults, fabric.controller, bridges)
    try:
        runner.start_servers()
        sampler.start()
        flows0 = {br: telemetry.flow_counters(br) for br in bridges}
        before = telemetry.snapshot(ports)
        t_start = time.monotonic() - sampler.t0
        injector.t0 = runner.start_clients(duration)
        if planned_faults:
            injector.start()
        progress(f"[{plan.policy_label}] {len(plan.flows)} flows for {duration:g} s ..."
                 + "".join(f"\n  fault at {f.at:g} s: {f.label}" for f in planned_faults))
        # CPU idle counts from when the last client was connected: starting them is set-up.
        connected = runner.wait_connected()
        t_fid = t_start if connected is None else connected - sampler.t0
        with Ticker(duration, f"[{plan.policy_label}] traffic"):
            runner.wait(timeout_s=duration + 15)
        fabric.timings["traffic_s"] = time.monotonic() - sampler.t0 - t_start
        injector.stop()
        faults.restore(planned_faults)
        after = telemetry.drained_snapshot(ports)
        t_end = time.monotonic() - sampler.t0
        flows1 = telemetry.settled_flow_counters(bridges)
        status = fabric.controller.request({"cmd": "status"})
    finally:
        if injector.is_alive():
            injector.stop()
        runner.stop()
        sampler.stop()
    runner.collect()
    # Counters are deltas between the two snapshots, so rates divide by the time between them.
    measured = max(t_end - t_start, 1e-3)
    counters = {br: {c: (v[0] - flows0[br].get(c, (0, 0))[0], v[1] - flows0[br].get(c, (0, 0))[1])
                     for c, v in flows1[br].items()} for br in bridges}
    result: dict[str, Any] = {
        "schema": SCHEMA_VERSION, "scenario": plan.scenario.name, **plan.policy_fields(),
        "seed": int(plan.params["seed"]), "duration_s": round(measured, 3),
        "environment": plan.env.as_result(), "topology": plan.topo_desc,
        "params": plan.params,
        "links": link_entries(ports, before, after, sampler, measured, t_start),
        "flows": flow_entries(plan.flows, counters, plan.topo_desc),
        # What the controller did: per-flow decisions taken, port-load samples fed to a
        # load-aware policy (0 for the others).
        "controller": {k: status.get(k) for k in ("decisions", "port_samples")},
    }
    if planned_faults:
        result["faults"] = faults.report(planned_faults, injector, status, plan.flows,
                                         runner.dir, duration)
        for f in result["flows"]:
            f.update(result["faults"]["per_flow"][f["id"]])
    result["metrics"] = plan.kind.analyse(result, plan.params)
    judged = sampler.judge(t_start, t_fid, t_end)
    idle = judged["cpu_idle_pct"]
    notes = list(plan.env.notes)
    if planned_faults:
        result["metrics"]["faults"] = result["faults"]["summary"]
        notes.append("faults injected (a flow's counters may show two paths, and bytes sent "
                     "into a dead link are lost in the datapath): "
                     + "; ".join(f.label for f in planned_faults))
        notes += result["faults"]["errors"]
    idle_min = judged["cpu_idle_min_pct"]
    valid = idle_min >= MIN_CPU_IDLE_PCT
    if not valid:
        notes.append(f"CPU-bound: least idle second had {idle_min:.0f}% idle "
                     f"(< {MIN_CPU_IDLE_PCT:g}%); numbers describe the emulator")
    if planned_faults and result["faults"]["errors"]:
        valid = False
    errors = [f"{f['id']}: {f['error']}" for f in result["flows"] if f.get("error")]
    if errors:
        valid = False
        notes += errors
    unclean = [f["id"] for f in result["flows"] if not f["path_clean"]]
    if unclean:
        notes.append(f"flows whose counters do not form one path: {', '.join(unclean)}")
    # With links failing, bytes sent into a dead link are lost by design and a flow's
    # counters can show two paths: the path-based loss check has nothing sound to say.
    unexplained = {} if planned_faults else diagnose.unexplained_loss(result)
    if unexplained:
        notes.append("bytes lost inside the switches' datapath, not in a configured queue: "
                     + ", ".join(f"{k} {v} B" for k, v in unexplained.items()))
    result["fidelity"] = {"cpu_idle_min_pct": idle_min, "cpu_idle_pct": idle, "valid": valid,
                          "lab_cpu_pct": judged["lab_cpu_pct"], "window_s": judged["window_s"],
                          "notes": notes, "datapath_loss_bytes": unexplained}
    return result


def write_report_quietly(out_dir: Path, log: Progress | None = None) -> Path | None:
    """report.html and its plots next to result.json (``lab.report``).

    A plot that fails must not cost the run its result: the failure is said, not raised,
    and ``fabriclab report DIR`` can regenerate the report later.
    """
    try:
        from lab import report
        return report.write_report(out_dir)
    except Exception as exc:      # any plotting failure: say it, keep the result
        (log or print)(f"report for {out_dir} not written: {type(exc).__name__}: {exc}")
        return None


def run(name: str, out: Path | None = None, progress: Progress = print,
        **kwargs: Any) -> list[tuple[Path, dict[str, Any]]]:
    """Validate, then execute one plan per policy. Returns [(result dir, result)]."""
    plans = make_plans(name, **kwargs)
    base = out or default_out_dir(plans[0].scenario.name)
    done = []
    for plan in plans:
        out_dir = base if len(plans) == 1 else base / plan.policy_label
        done.append((out_dir, execute(plan, out_dir, progress)))
        write_report_quietly(out_dir, progress)
    if len(plans) > 1:
        summary = {r["policy"]: r["metrics"] for _, r in done}
        base.mkdir(parents=True, exist_ok=True)
        (base / "summary.json").write_text(json.dumps(summary, indent=1))
    return done
