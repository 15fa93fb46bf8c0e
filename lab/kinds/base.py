"""What a scenario kind provides (``Kind``), what every run is (``Plan``), and the steps
every kind on a fabric shares: bring-up, and the assembly of a phased kind's part.

A kind is a package under ``lab/kinds/`` whose façade (``__init__``) builds one ``Kind``,
``KIND``; the registry is ``lab.kinds.KINDS``. ``lab.run`` owns the one execute template -
validated plan, lab session, the kind's run, logs kept, the result's envelope stamped and
written - and calls the kind only for what only it knows. Every caller (``lab.run``,
``lab.report``, ``lab.regress``, ``lab.cli``) calls a hook as a plain attribute: an optional
hook a kind leaves out is this module's default, never a ``hasattr``.

Why a frozen dataclass holding the functions, not a ``typing.Protocol`` a module satisfies:
a dataclass has defaults for the optional hooks (a Protocol only describes), it is checked
when the façade builds it (a kind that misses a required hook is refused at import, with
one line naming the hook), and ``plan.kind.run`` is typed, so a reader following
``fabriclab run`` does not lose the trail at the kind.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controllers import policies
from lab.analysis import diagnose
from lab.machine import environment
from lab.measure import headroom, live, telemetry
from lab.model import scenario
from lab.model.capacity import Expectation
from lab.model.result import SCHEMA_VERSION
from lab.net.topologies import FabricTopo, make_topology
from lab.plotting.plots import Skipped, Spec
from lab.plotting.sections import Section

if TYPE_CHECKING:                       # a type only: the kinds' interface names it
    from lab.net.fabric import Fabric

Progress = Callable[[str], None]
#: The envelope: the fields ``lab.run.stamp`` puts on every result, whatever its kind
#: (``Plan.envelope``, then ``timings`` and ``finished``); a kind's part never carries them.
ENVELOPE_KEYS = ("schema", "scenario", "kind", "policy", "policy_file", "seed", "params",
                 "environment", "topology", "timings", "finished")
#: A kind's plots, as ``lab.plotting`` specs (None: nothing to say about this one).
Plots = Sequence[Spec | Skipped | None]


def _no_predictions(_result: dict[str, Any]) -> dict[str, float]:
    return {}


def _no_topology_defaults(_params: dict[str, Any]) -> dict[str, Any]:
    return {}


def _nothing_to_prepare(_plan: Plan) -> None:
    return None


def _no_logs(_work: Path, _out_dir: Path) -> None:
    return None


def _no_run_plots(_result: dict[str, Any], _sections: list[Section]) -> Plots:
    return []


def _no_section_plots(_section: Section, _run_dir: Path | None) -> Plots:
    return []


def _no_warnings(_plan: Plan) -> list[str]:
    return []


def _one_machine_only(plan: Plan) -> tuple[str, str]:
    return ("kind", f"{plan.scenario.name} is a {plan.kind.name} scenario, whose programs "
            "run on one machine only so far")


def splits_anywhere(_plan: Plan) -> None:
    """A kind whose every plan runs split over machines: nothing to refuse."""
    return None


@dataclass(frozen=True)
class Kind:
    """What a scenario kind provides. Required hooks first; the rest default to nothing.

    Required:

    ``name``
        the kind's name, as scenarios (``kind:``) and result.json (``kind``) say it.
    ``schema``
        its scenario keys (``lab.model.scenario.Param``), checked before anything starts.
    ``plan(topo_desc, params, rng)``
        the traffic to run, checked before anything starts: ``FlowSpec``s, or items that
        give one (``spec()``) with their ``phase`` where the kind has phases.
    ``run(plan, fabric, progress, prepared)``
        on the unstarted fabric of a held session: bring it up, put the traffic on it and
        return the kind's part of result.json - ``duration_s``, ``links``, ``flows``,
        ``metrics``, ``fidelity`` (its own numbers and notes) and anything of its own -
        never the envelope (``Plan.envelope``: ``lab.run`` stamps it).
    ``summary_rows(result)``
        the lines ``fabriclab run`` prints after the run.
    ``regress_metrics(result)``
        what ``fabriclab regress`` holds a policy to (names from ``lab.regress.METRICS``,
        prefixed with a phase where the kind has phases).

    Optional:

    ``defaults``
        values of keys a scenario may leave out, scaled with ``rate_scale`` like the
        scenario's own (default: none).
    ``topology_defaults(params)``
        the topology keys the kind's run needs unless the scenario sets them (the
        streaming kind's edge: its type and the rates its streams are planned for);
        applied before the topology is described, so a ``--set`` still wins (default:
        none).
    ``prepare(plan)``
        checks of the machine that need the plan, still before anything starts; its value
        is handed to ``run`` as ``prepared`` (default: None).
    ``keep_logs(work, out_dir)``
        logs of its own to copy out of the session's work directory before it is removed
        (default: none; the controller's log and iperf3's JSON are every run's).
    ``run_plots(result, sections)``, ``section_plots(section, run_dir)``
        its own plots (``lab.plotting`` specs), drawn by the report before, and per phase
        after, the plots every run gets (default: none).
    ``warnings(plan)``
        what the user should know before the start that does not stop the run (the run
        shows what happens), one line each, beginning ``warning:``; printed by ``run`` and
        ``--dry-run`` (default: none).
    ``predictions(result)``
        what the policy's function predicts for some of ``regress_metrics`` (same keys),
        shown beside the measured values by ``fabriclab regress`` (default: none).
    ``cluster_refusal(plan)``
        why the plan cannot run split over several machines (``run --cluster``), as the
        field to blame and the reason, or None when it can; checked before anything starts
        (default: refused, the kind's programs run on one machine only).
    """

    name: str
    schema: dict[str, scenario.Param]
    plan: Callable[[dict[str, Any], dict[str, Any], random.Random], list[Any]]
    run: Callable[[Plan, Fabric, Progress, Any], dict[str, Any]]
    summary_rows: Callable[[dict[str, Any]], list[tuple[str, str]]]
    regress_metrics: Callable[[dict[str, Any]], dict[str, float]]
    _: KW_ONLY
    defaults: dict[str, Any] = field(default_factory=dict)
    topology_defaults: Callable[[dict[str, Any]], dict[str, Any]] = _no_topology_defaults
    prepare: Callable[[Plan], Any] = _nothing_to_prepare
    keep_logs: Callable[[Path, Path], None] = _no_logs
    run_plots: Callable[[dict[str, Any], list[Section]], Plots] = _no_run_plots
    section_plots: Callable[[Section, Path | None], Plots] = _no_section_plots
    warnings: Callable[[Plan], list[str]] = _no_warnings
    cluster_refusal: Callable[[Plan], tuple[str, str] | None] = _one_machine_only
    predictions: Callable[[dict[str, Any]], dict[str, float]] = _no_predictions


@dataclass
class Plan:
    """A fully validated run: nothing has been started yet."""

    scenario: scenario.Scenario
    kind: Kind
    params: dict[str, Any]
    policy: str
    topo_desc: dict[str, Any]
    flows: list[Any]
    env: environment.Environment
    runtime: str
    #: What the plan is expected to do to this machine's fidelity (``lab.model.capacity``),
    #: estimated before anything starts and recorded as ``fidelity.expected``.
    expected: Expectation | None = None

    def topology(self) -> FabricTopo:
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

    def envelope(self) -> dict[str, Any]:
        """The fields every result has, whatever its kind, known before the run starts:
        ``lab.run.stamp`` puts them (with ``timings`` and ``finished``) around the kind's
        part; a kind whose metrics read them (ecmp's prediction reads the policy and the
        topology) reads them from here, not from a copy of its own."""
        return {"schema": SCHEMA_VERSION, "scenario": self.scenario.name,
                "kind": self.kind.name, **self.policy_fields(),
                "seed": int(self.params["seed"]), "params": self.params,
                "environment": self.env.as_result(), "topology": self.topo_desc}


def bring_up(plan: Plan, fabric: Fabric, progress: Progress) -> float:
    """Start the fabric and ping all pairs, saying so; returns the pingall loss in %."""
    progress(f"[{plan.policy_label}] bringing up {plan.topo_desc['type']} "
             f"({len(plan.topo_desc['switches'])} switches, "
             f"{len(plan.topo_desc['hosts'])} hosts), controller {plan.runtime}")
    live.set_phase("bring-up")
    fabric.start()
    loss = fabric.pingall()
    progress(f"[{plan.policy_label}] up in {fabric.timings['ready_s']:.1f} s; "
             f"pingall loss {loss:.0f}%")
    return loss


@dataclass
class PhaseCounts:
    """One phase of a phased kind, as the shared assembly reads it: its window's links and
    flows, and the fidelity numbers of its judged seconds."""

    duration_s: float
    links: list[dict[str, Any]]
    flows: list[dict[str, Any]]
    cpu_idle_min_pct: float
    lab_cpu_pct: float | None
    #: The kind's own verdict on the phase (CPU idle, every program's output read).
    valid: bool
    #: What ``phase_details`` keeps of the phase (its links and flows at least).
    details: dict[str, Any]
    #: The datapath's waiting and the CPU classes over the phase (``headroom.cpu_fields``).
    cpu: dict[str, Any] = field(default_factory=dict)

    def judged(self) -> dict[str, Any]:
        """The phase's CPU numbers as a judged window has them."""
        return {"cpu_idle_min_pct": self.cpu_idle_min_pct, **self.cpu}


def phased_part(plan: Plan, phases: dict[str, PhaseCounts], main: str,
                metrics: dict[str, Any], notes: list[str] | None = None,
                valid: bool = True, fidelity: dict[str, Any] | None = None) -> dict[str, Any]:
    """A phased kind's part of result.json, assembled one way for every such kind.

    The top-level ``duration_s``, ``links`` and ``flows`` are ``main``'s (the phase the
    scenario is about: what ``fabriclab diagnose`` explains and a comparison lines up);
    every phase's own are under ``phase_details``. The fidelity is the worst phase's: the
    least idle CPU, the busiest lab, valid only if every phase (and ``valid``, the kind's
    verdict on what the phases share) is; ``notes`` and ``fidelity`` add the kind's own.
    """
    top = phases[main]
    notes = list(notes or [])
    notes += [f"{n}: {why}" for n, p in phases.items()
              if (why := headroom.cpu_verdict(p.judged())) is not None]
    notes += [f"{n}: {s}" for n, p in phases.items() for s in headroom.starved_notes(p.judged())]
    part: dict[str, Any] = {
        "duration_s": top.duration_s, "phase": main, "links": top.links, "flows": top.flows,
        "metrics": metrics, "phase_details": {n: p.details for n, p in phases.items()},
        "fidelity": {
            "cpu_idle_min_pct": min(p.cpu_idle_min_pct for p in phases.values()),
            "lab_cpu_pct": telemetry.worst_lab_cpu_pct(p.lab_cpu_pct for p in phases.values()),
            "valid": valid and all(p.valid for p in phases.values()),
            "datapath_wait_max_ms": max((p.cpu.get("datapath_wait_max_ms", 0.0)
                                         for p in phases.values()), default=0.0),
            "phases": {n: {"valid": p.valid, "cpu_idle_min_pct": p.cpu_idle_min_pct,
                           **p.cpu}
                       for n, p in phases.items()},
            "notes": notes, **(fidelity or {})},
    }
    part["fidelity"]["datapath_loss_bytes"] = diagnose.unexplained_loss(
        {"topology": plan.topo_desc, **part})
    return part
