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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Progress = Callable[[str], None]


def bring_up(plan: Any, fabric: Any, progress: Progress) -> float:
    """Start the fabric and ping all pairs, saying so; returns the pingall loss in %."""
    progress(f"[{plan.policy_label}] bringing up {plan.topo_desc['type']} "
             f"({len(plan.topo_desc['switches'])} switches, "
             f"{len(plan.topo_desc['hosts'])} hosts), controller {plan.runtime}")
    fabric.start()
    loss = fabric.pingall()
    progress(f"[{plan.policy_label}] up in {fabric.timings['ready_s']:.1f} s; "
             f"pingall loss {loss:.0f}%")
    return loss
