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
- ``result["phase_details"][p]["links"]`` and ``["flows"]``: what each switch port counted
  (bytes, drops, its queue and rate over time), each connection's ends (``src``, ``dst``),
  path, bytes per switch (``hop_bytes``) and the ``interface`` it used, as a flow record
  has them: no label says what a connection is for;
- ``result["phase_details"][p]["scheduler"]``: what the cluster's scheduler says, as an
  operator has it: ``jobs`` (each job's hosts), ``job`` (the job whose ranks these are) and
  ``storage`` (the storage hosts). A connection between two of the job's hosts is its
  all-reduce; from a storage host to the job, its data; between two hosts of another job,
  that job's; anything else runs on hosts no job was given;
- ``result["topology"]``: the switches, hosts and links' rates as the fabric was built
  (a phase's own link settings are not given); ``metrics["bottleneck_bps"]``:
  the slowest link the job's all-reduce crossed.

Write ``causes(metrics, details, topology)``: the causes that made the GPUs wait in that
phase, from ``"data"`` (storage too slow), ``"cpu"`` (preprocessing too slow),
``"placement"`` (the ranks spread over more racks than they need), ``"interface"`` (the
collective off the fabric's NIC), ``"network"`` (the all-reduce slower than its ideal),
``"other-job"`` (another job on its links) and ``"straggler"`` (a slow rank); ``[]`` when
the GPUs only waited for the all-reduce's own time. Try it on any run of gpu-wait:

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


def causes(metrics: dict[str, Any], details: dict[str, Any],
           topology: dict[str, Any]) -> list[str]:
    # TODO: 1. per measured step (not warm-up), the rank that finished computing last
    #          (largest t_compute_end): its parts, summed over the steps, over its step time.
    #       2. split its data wait by what the loaders' workers spent their time on:
    #          fetching (fetch_s) or preprocessing (prep_wall_s).
    #       3. the all-reduce's ideal share (ideal_comm_s / step_mean_s) against the same
    #          at the best bottleneck a placement in one rack would have: placement, or
    #          interface if its flows ran off the fabric.
    #       4. its exposed comm and barrier beyond the ideal: network, or other-job if the
    #          busiest link it shared carried mostly another job.
    #       5. how much longer it computed than the step's median rank (the others waited
    #          for it): straggler, if one rank's mean compute is well over the fastest's.
    #       6. name each cause holding at least 15 % of the step.
    return []


def who_waited(result: dict[str, Any]) -> dict[str, list[str]]:
    """{phase: its causes} for every phase of the result."""
    return {name: causes(m, result["phase_details"][name], result["topology"])
            for name, m in result["metrics"]["phases"].items()}


if __name__ == "__main__":
    for phase, named in who_waited(json.loads(Path(sys.argv[1]).read_text())).items():
        print(f"{phase}: {', '.join(named) or 'nothing beyond the all-reduce'}")
