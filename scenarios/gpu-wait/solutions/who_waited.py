"""Solution: who made the GPUs wait, per phase, from the ranks' steps and the loaders' records.

1. The step that matters is the one of the rank that finished computing last: in a ring an
   early rank's all-reduce cannot end before the late rank joins, so the early ranks' exposed
   comm holds the late rank's wait; the late rank's own parts say what held the step. Sum
   each part of that rank over the measured steps and divide by their step time.
2. Its data wait is the loaders': split it by what the loaders' workers spent their time on,
   fetching a batch from storage (``data``: the storage links are too slow) or preprocessing
   it (``cpu``: too few workers or too much work per batch).
3. Its exposed comm beyond the all-reduce's ideal at the bottleneck's rate is the
   ``network``'s; its barrier (waiting for a slower rank) is a ``straggler``'s.
4. Name a cause when it holds at least a tenth of the step, the largest first.

``fabriclab diagnose`` does the same (lab/analysis/gpuwait.py) and says so with its evidence.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

EXERCISE = "who-waited"     # `fabriclab grade` finds the exercise by this line

#: A cause holding the GPUs for less than this share of the step is noise: a healthy step
#: waits 0.04 % for data and spends under 2 % beyond the all-reduce's ideal.
NAMED_MIN_SHARE = 0.10
PARTS = ("data_wait", "compute", "exposed_comm", "barrier")


def critical_share(details: dict[str, Any]) -> dict[str, float]:
    """Each part's share of the step of each measured step's last rank to finish computing."""
    ranks = details["gpu_wait"]["ranks"]
    by_step: dict[int, list[dict[str, Any]]] = {}
    for rank in ranks:
        for s in rank["steps"]:
            if not s["warmup"] and s.get("t_compute_end") is not None:
                by_step.setdefault(s["step"], []).append(s)
    last = [max(rows, key=lambda s: s["t_compute_end"]) for rows in by_step.values()
            if len(rows) == len(ranks)]
    total = sum(s["step_s"] for s in last)
    return {p: sum(s[f"{p}_s"] for s in last) / total if total else 0.0 for p in PARTS}


def fetching_share(details: dict[str, Any]) -> float:
    """The loaders' time spent fetching batches, against fetching plus preprocessing them."""
    fetch = prep = 0.0
    for rank in details["gpu_wait"]["ranks"]:
        for w in rank["loader"]["per_worker"]:
            fetch += w["fetch_s"]
            prep += w["prep_wall_s"]
    return fetch / (fetch + prep) if fetch + prep else 0.0


def causes(metrics: dict[str, Any], details: dict[str, Any]) -> list[str]:
    """One phase's causes, the largest first; [] when nothing but the all-reduce's own time."""
    crit = critical_share(details)
    fetching = fetching_share(details)
    ideal = metrics["ideal_comm_s"] / metrics["step_mean_s"] if metrics["step_mean_s"] else 0.0
    shares = {"data": crit["data_wait"] * fetching,
              "cpu": crit["data_wait"] * (1.0 - fetching),
              "network": max(0.0, crit["exposed_comm"] - ideal),
              "straggler": crit["barrier"]}
    return sorted((c for c, v in shares.items() if v >= NAMED_MIN_SHARE),
                  key=lambda c: -shares[c])


def who_waited(result: dict[str, Any]) -> dict[str, list[str]]:
    """{phase: its causes} for every phase of the result."""
    return {name: causes(m, result["phase_details"][name])
            for name, m in result["metrics"]["phases"].items()}


if __name__ == "__main__":
    for phase, named in who_waited(json.loads(Path(sys.argv[1]).read_text())).items():
        print(f"{phase}: {', '.join(named) or 'nothing beyond the all-reduce'}")
