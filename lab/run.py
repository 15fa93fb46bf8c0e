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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controllers import policies as policy_registry
from lab import kinds
from lab.analysis import partition
from lab.kinds.base import ENVELOPE_KEYS, Kind, Plan, Progress
from lab.machine import environment, state
from lab.measure import headroom
from lab.measure import live as measure_live
from lab.model import capacity, scenario
from lab.model import cluster as cluster_model
from lab.model.errors import MachineError
from lab.model.flows import FlowSpec
from lab.model.policies import policy_names
from lab.model.result import validate
from lab.net.cluster import ClusterRun
from lab.net.fabric import Fabric
from lab.net.topobase import refuse_without_netem
from lab.net.topologies import build_defaults, describe, make_topology


@dataclass
class CheckedInput:
    """A scenario with every ``--set`` and override applied and checked; no machine yet."""

    scenario: scenario.Scenario
    kind: Kind
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
    params = scenario.apply_sets(sc.params, scenario.parse_set(sets or []), kind.schema)
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
    scenario.validate(params, kind.schema)
    # What the kind's run needs of its topology, unless the scenario or a --set says.
    params["topology"] = {**kind.topology_defaults(params), **params.get("topology", {})}
    params["rate_scale"] = float(params.get(
        "rate_scale", environment.vm_rate_scale(params.get("tcg_rate_scale"))))
    if params["rate_scale"] != 1.0:
        topo = params.get("topology", {})
        defaults = {**kind.defaults,
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
    state.require_root()
    env = environment.detect(runtime)
    if env.datapath == "user" and not env.userspace_tso:
        raise MachineError("ovs", "; ".join(env.notes) or "userspace TSO is off")
    refuse_without_netem(given.topo_desc, env.netem)
    chosen = environment.pick_runtime(env.runtimes, runtime)
    return [Plan(given.scenario, given.kind, given.params, p, given.topo_desc, given.flows,
                 env, chosen, expected_fidelity(given, p, env.datapath))
            for p in given.policies]


def expected_fidelity(given: CheckedInput | Plan, policy: str, datapath: str,
                      cores: int | None = None,
                      switches: tuple[str, ...] | None = None) -> capacity.Expectation:
    """Whether this machine's datapath is expected to keep the run's fidelity valid
    (``lab.model.capacity``): for every kind, from the flows its plan returned; with
    ``switches``, a cluster worker's that forwards for those alone.

    A kind's planned traffic is a list of ``FlowSpec`` or of items that give one
    (``spec()``, the streaming kind's streams), each with its ``phase`` where the kind has
    phases; the phases run one after another, so each is weighed alone.
    """
    phases: dict[str, list[FlowSpec]] = {}
    for item in given.flows or []:
        spec = item.spec() if hasattr(item, "spec") else item
        if isinstance(spec, FlowSpec):
            phases.setdefault(str(getattr(item, "phase", "")), []).append(spec)
    return capacity.expect(given.topo_desc, phases or {"": []},
                           policy_registry.resolve(policy).granularity, datapath,
                           cores or os.cpu_count() or 1, float(given.params["rate_scale"]),
                           on=switches)


def expectation_line(plan: Plan, exp: capacity.Expectation | None = None,
                     label: str = "") -> str:
    """The plan's expected fidelity (or ``exp``, a worker's) on one line: the warning
    when invalid."""
    exp = plan.expected if exp is None else exp
    tag = f"[{plan.policy_label}]{label}"
    if exp is None:
        return f"{tag} expected fidelity: not estimated"
    if exp.verdict == "invalid":
        return f"{tag} {exp.warning()}"
    if exp.verdict == "valid":
        return (f"{tag} expected fidelity: valid - {exp.load * 100:.0f} % "
                f"of what this machine's datapath held at the fidelity line ({exp.source})")
    return f"{tag} expected fidelity: not estimated - {exp.why}"


def kind_warnings(plans: list[Plan]) -> list[str]:
    """The kind's warnings about the plans' settings, each line once: the policies' plans
    share the scenario's settings."""
    return list(dict.fromkeys(line for plan in plans for line in plan.kind.warnings(plan)))


def worker_expectations(plan: Plan, cluster: ClusterRun) -> dict[str, capacity.Expectation]:
    """Each worker's expected fidelity: the capacity model on the hops of the switches
    placed there (``capacity.switch_shares``), with its stated cores (the head's count
    when the file states none), and the head's datapath (every worker is set up alike)."""
    switches = {s["name"] for s in plan.topo_desc["switches"]}
    return {w.name: expected_fidelity(
        plan, plan.policy, plan.env.datapath, w.cores,
        tuple(sorted(n for n, at in cluster.where.items() if at == w.name and n in switches)))
        for w in cluster.spec.workers}


def default_out_dir(scenario_name: str) -> Path:
    return Path("results") / f"{scenario_name}-{time.strftime('%Y%m%d-%H%M%S')}"


#: Topologies a cluster run can split: the Clos fabrics the partition plan knows.
CLUSTER_TOPOLOGIES = ("leafspine", "fattree")


def plan_cluster(path: str | Path, plan: Plan | CheckedInput,
                 progress: Progress = print) -> ClusterRun:
    """The cluster file checked and the plan's fabric placed on its workers (FabricLab's
    partition plan), before anything is started; a warning when the tunnels' planned
    traffic exceeds a worker's stated NIC rate."""
    spec = cluster_model.load(path)
    refused = plan.kind.cluster_refusal(plan)
    if refused is not None:
        raise cluster_model.ClusterError(*refused)
    if plan.topo_desc["type"] not in CLUSTER_TOPOLOGIES:
        raise cluster_model.ClusterError(
            "cluster", f"the {plan.topo_desc['type']} topology cannot be split over "
            f"machines yet (only {', '.join(CLUSTER_TOPOLOGIES)})")
    part = partition.partition(plan.topo_desc, len(spec.workers))
    where = {node: spec.workers[i].name for node, i in part.assignment.items()}
    for w, planned in zip(spec.workers, part.workers, strict=True):
        if w.nic_mbps is not None and planned.tunnel_mbps > w.nic_mbps:
            progress(f"[cluster] warning: {w.name}'s tunnels carry up to "
                     f"{planned.tunnel_mbps:g} Mbit/s each way at full load, more than its "
                     f"NIC's {w.nic_mbps:g}: the NIC, not the emulated links, may be the "
                     "bottleneck")
    return ClusterRun(spec, where)


def cluster_section(cluster: ClusterRun, result: dict[str, Any]) -> dict[str, Any]:
    """result.json's ``cluster``: the workers, the placement, every tunnel with its bytes
    and drops (its two ends are ports like any other), each worker's least idle second
    and the lab's own CPU on it, and the clock offsets."""
    where = cluster.where
    tunnels = [{"node": e["node"], "peer": e["peer"], "intf": e["intf"],
                "worker": where[e["node"]], "peer_worker": where[e["peer"]],
                "tx_bytes": e["tx_bytes"], "tx_packets": e["tx_packets"], "drops": e["drops"]}
               for e in result.get("links", []) if where.get(e["peer"]) not in
               (None, where.get(e["node"]))]
    return {**cluster.summary(), "tunnels": tunnels,
            "fidelity": cluster.fidelity, "removed": cluster.removed,
            "expected": {n: e.as_dict() for n, e in cluster.expected.items()}}


@contextmanager
def fabric_session(label: str, topo: Any, env: environment.Environment, runtime: str,
                   policy: str, seed: int,
                   cluster: ClusterRun | None = None) -> Iterator[Fabric]:
    """Lock the lab, record the run, yield an unstarted fabric; tear down on any exit."""
    with state.run_session(label) as (record, work):
        fabric = Fabric(topo, env, runtime, policy, seed, work, record, cluster)
        try:
            with state.signals_as_exit():
                yield fabric
        finally:
            fabric.stop()


def execute(plan: Plan, out_dir: Path, progress: Progress = print,
            cluster: ClusterRun | None = None) -> dict[str, Any]:
    """Run one plan on a fresh fabric; returns the result (also written to out_dir).

    The one template for every kind (``lab.kinds.base``): the kind's own checks, the lab's
    session, the kind's run, its logs kept whatever happened, timings, the result held to
    the schema and written.
    """
    kind = plan.kind
    prepared = kind.prepare(plan)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_run = time.monotonic()
    with fabric_session(f"{plan.scenario.name}-{plan.policy_label}", plan.topology(), plan.env,
                        plan.runtime, plan.policy, int(plan.params["seed"]),
                        cluster) as fabric:
        try:
            part = kind.run(plan, fabric, progress, prepared)
            part.setdefault("fidelity", {})["cpu_control"] = fabric.cpu.describe()
        finally:
            keep_logs(fabric.run_dir, out_dir)
            kind.keep_logs(fabric.run_dir, out_dir)
    timings = {k: round(v, 3) for k, v in fabric.timings.items()}
    if cluster is not None:
        timings.update({k: round(v, 3) for k, v in cluster.timings.items()})
    timings["wall_s"] = round(time.monotonic() - t_run, 3)
    result = stamp(plan, part, timings)
    if cluster is not None:
        add_cluster(result, cluster)
    write_result(result, out_dir)
    return result


def add_cluster(result: dict[str, Any], cluster: ClusterRun) -> None:
    """A cluster run's ``cluster`` section, and its workers' verdicts in the fidelity: the
    template's, whatever the kind (a run is only as valid as its busiest worker)."""
    result["cluster"] = cluster_section(cluster, result)
    bad = cluster.invalid_because() + [
        f"worker {name} CPU-bound: least idle second {f['cpu_idle_min_pct']:.0f}% "
        f"(< {headroom.MIN_CPU_IDLE_PCT:g}%)" for name, f in cluster.fidelity.items()
        if float(f["cpu_idle_min_pct"] or 0.0) < headroom.MIN_CPU_IDLE_PCT]
    if bad:
        result["fidelity"]["valid"] = False
        result["fidelity"]["notes"].extend(bad)


def stamp(plan: Plan, part: dict[str, Any], timings: dict[str, float]) -> dict[str, Any]:
    """The whole result: the envelope every result has (``Plan.envelope``: scenario, kind,
    policy, seed, params, environment, topology), the kind's ``part``, ``timings`` and
    when it ``finished``; the environment's notes and the expected fidelity join the
    part's ``fidelity``.

    A kind returns only its part; one that carries an envelope field is a bug in the kind,
    refused here rather than silently overwritten.
    """
    clash = sorted(set(part) & set(ENVELOPE_KEYS))
    if clash:
        raise MachineError("result", f"the {plan.kind.name} kind's part carries envelope "
                           f"fields: {', '.join(clash)}")
    fidelity = dict(part["fidelity"])
    fidelity["notes"] = [*plan.env.notes, *fidelity.get("notes", [])]
    if plan.expected is not None:
        fidelity["expected"] = plan.expected.as_dict()
    return {**plan.envelope(), **part, "fidelity": fidelity, "timings": timings,
            # When the run finished, in UTC: reports and comparisons date a run by it,
            # not by the file's modification time, which a copy resets.
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_result(result: dict[str, Any], out_dir: Path) -> None:
    """Hold the result to schema 1, then write it: an invalid result is never written."""
    problems = validate(result)
    if problems:
        raise MachineError("result", "; ".join(problems))
    (out_dir / "result.json").write_text(json.dumps(result, indent=1))


def keep_logs(work: Path, out_dir: Path) -> None:
    """Copy the controller's log (and its policy jail's, for a policy file: what the file
    printed) and iperf3 JSON out of the work dir before it is removed."""
    for log in ("controller.log", "policy.log"):
        if (work / log).exists():
            shutil.copy(work / log, out_dir / log)
    if (work / "iperf3").is_dir():
        shutil.copytree(work / "iperf3", out_dir / "iperf3", dirs_exist_ok=True)


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


@contextmanager
def live_view(plans: list[Plan], progress: Progress, on: bool) -> Iterator[Progress]:
    """With ``on``, the run's live page (``lab.report.live``) for the body, and a progress
    that tells it each line too; without, ``progress`` as it is and nothing started."""
    if not on:
        yield progress
        return
    from lab.report.live import watching
    title = f"{plans[0].scenario.name}: {', '.join(p.policy_label for p in plans)}"
    with watching(plans[0].topo_desc, title, progress) as feed:
        def said(message: str) -> None:
            feed.note(message)
            progress(message)
        yield said


def run(name: str, out: Path | None = None, progress: Progress = print, live: bool = False,
        cluster: str | Path | None = None,
        **kwargs: Any) -> list[tuple[Path, dict[str, Any]]]:
    """Validate, then execute one plan per policy. Returns [(result dir, result)].

    With ``live``, a page on 127.0.0.1 shows the fabric's links as they run, from before
    the first plan's bring-up until the last report is written. With ``cluster`` (a cluster
    file), each plan's fabric is split over the file's workers (``lab.net.cluster``).
    """
    if cluster is not None:      # the user's input first, then the machine
        if live:
            raise cluster_model.ClusterError("live", "the live view shows this machine's "
                                             "ports only: not with --cluster")
        given = check_input(name, **{k: v for k, v in kwargs.items() if k != "runtime"})
        plan_cluster(cluster, given, progress)      # refused here, before anything
    plans = make_plans(name, **kwargs)
    for plan in plans:           # before anything starts: a warning, not a refusal
        if plan.expected is not None and plan.expected.verdict == "invalid":
            progress(expectation_line(plan))
    for line in kind_warnings(plans):
        progress(line)
    base = out or default_out_dir(plans[0].scenario.name)
    done = []
    with live_view(plans, progress, live) as progress:
        for plan in plans:
            out_dir = base if len(plans) == 1 else base / plan.policy_label
            split = plan_cluster(cluster, plan, lambda _m: None) if cluster else None
            if split is not None:
                split.expected = worker_expectations(plan, split)
                for name, exp in split.expected.items():
                    progress(expectation_line(plan, exp, f" {name}:"))
            done.append((out_dir, execute(plan, out_dir, progress, split)))
            measure_live.set_phase("writing the report")
            write_report_quietly(out_dir, progress)
    if len(plans) > 1:
        summary = {r["policy"]: r["metrics"] for _, r in done}
        base.mkdir(parents=True, exist_ok=True)
        (base / "summary.json").write_text(json.dumps(summary, indent=1))
    return done
