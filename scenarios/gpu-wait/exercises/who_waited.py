"""Exercise: who made the GPUs wait? From one phase's measurements alone (skeleton).

You get a gpu-wait run's result.json with every phase renamed (``p0``, ``p1``, ... in no
particular order) and its settings taken out: no loader worker counts, no preprocessing
time per batch, no storage link setting, no diagnosis. Per phase there is what was measured:

- ``result["metrics"]["phases"][p]``: the step's numbers, e.g. ``step_mean_s`` and
  ``ideal_comm_s`` (the all-reduce's time at its bottleneck's rate);
- ``result["phase_details"][p]["gpu_wait"]["ranks"]``: per rank its ``steps`` (each with
  ``data_wait_s``, ``compute_s``, ``exposed_comm_s``, ``barrier_s``, ``step_s``,
  ``t_compute_end``, ``warmup``) and its ``loader``'s record per worker
  (``loader["per_worker"]``: ``fetch_s`` fetching batches from storage, ``prep_wall_s``
  preprocessing them);
- ``result["phase_details"][p]["links"]`` and ``["flows"]``: each link's rate and bytes,
  each connection's bytes (the loaders' are ``kind`` ``loader``).

Write ``causes(metrics, details)``: the causes that made the GPUs wait in that phase, from
``"data"`` (storage too slow), ``"cpu"`` (preprocessing too slow), ``"network"`` (the
all-reduce slower than its ideal) and ``"straggler"`` (a slow rank); ``[]`` when the GPUs
only waited for the all-reduce's own time. Try it on any run of gpu-wait:

    python scenarios/gpu-wait/exercises/who_waited.py results/<run>/result.json
    sudo fabriclab grade scenarios/gpu-wait/exercises/who_waited.py

A solution is in ../solutions/.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

EXERCISE = "who-waited"     # `fabriclab grade` finds the exercise by this line


def causes(metrics: dict[str, Any], details: dict[str, Any]) -> list[str]:
    # TODO: 1. per measured step (not warm-up), the rank that finished computing last
    #          (largest t_compute_end): its parts, summed over the steps, over its step time.
    #       2. split its data wait by what the loaders' workers spent their time on:
    #          fetching (fetch_s) or preprocessing (prep_wall_s).
    #       3. its exposed comm beyond ideal_comm_s / step_mean_s; its barrier.
    #       4. name each cause holding at least a tenth of the step.
    return []


def who_waited(result: dict[str, Any]) -> dict[str, list[str]]:
    """{phase: its causes} for every phase of the result."""
    return {name: causes(m, result["phase_details"][name])
            for name, m in result["metrics"]["phases"].items()}


if __name__ == "__main__":
    for phase, named in who_waited(json.loads(Path(sys.argv[1]).read_text())).items():
        print(f"{phase}: {', '.join(named) or 'nothing beyond the all-reduce'}")
