"""What a scenario kind provides, and the steps every kind on a fabric shares.

A kind is a package under ``lab/kinds/`` (the registry is ``lab.kinds.KINDS``). ``lab.run``
owns the one execute template - validated plan, lab session, the kind's run, logs kept,
result written - and calls the kind for what only it knows:

``SCHEMA``
    its scenario keys (``lab.model.scenario.Param``); ``DEFAULTS`` optionally, the values of
    keys a scenario may leave out (scaled with ``rate_scale`` like the scenario's own).
``plan(topo_desc, params, rng)``
    the flows to run, checked before anything starts.
``prepare(plan)`` (optional)
    checks of the machine that need the plan, still before anything starts; its value is
    handed to ``run``.
``run(plan, fabric, progress, prepared)``
    on the unstarted fabric of a held session: bring it up, put the traffic on it, return
    result.json without ``timings`` (the template adds them).
``keep_logs(work, out_dir)`` (optional)
    logs of its own to copy out of the session's work directory before it is removed.
``analyse(result, params)`` and ``summary_rows(result)``
    its ``metrics`` and the lines ``fabriclab run`` prints.
``regress_metrics(result)``
    what ``fabriclab regress`` holds a policy to (names from ``lab.regress.METRICS``,
    prefixed with a phase where the kind has phases).
``run_plots(result, sections)``, ``section_plots(section, run_dir)`` (optional)
    its own plots (``lab.plotting`` specs), drawn by the report before, and per phase
    after, the plots every run gets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controllers import policies
from lab.machine import environment
from lab.measure import live
from lab.model import scenario
from lab.model.capacity import Expectation
from lab.model.flows import FlowSpec
from lab.net.topologies import FabricTopo, make_topology

if TYPE_CHECKING:                       # a type only: the kinds' interface names it
    from lab.net.fabric import Fabric

Progress = Callable[[str], None]


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
