"""ecmp-faults: how long was each flow out, read from the receivers' 0.1 s intervals.

The answer gets a copy of the reference run's directory with the lab's own per-flow
outages taken out of result.json; they are what it is checked against.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from lab.grade.exercise import Exercise, Outcome

TOLERANCE_S = 0.05            # under one receiver interval (0.1 s)


def given(run_dir: Path, scratch: Path) -> Path:
    """The run directory without the lab's answer (``out_s`` per flow and its sums)."""
    result = json.loads((run_dir / "result.json").read_text())
    for f in result["flows"]:
        f.pop("out_s", None)
        f.pop("longest_out_s", None)
    result["faults"].pop("per_flow", None)
    for summary in (result["faults"].get("summary", {}), result["metrics"].get("faults", {})):
        for key in [k for k in summary if k.startswith("outage")]:
            summary.pop(key)
    copy = scratch / "run"
    copy.mkdir()
    (copy / "result.json").write_text(json.dumps(result))
    shutil.copytree(run_dir / "iperf3", copy / "iperf3")
    return copy


def checks(answer: Any, result: dict[str, Any]) -> list[Outcome]:
    truth = {f["id"]: float(f["out_s"]) for f in result["flows"]}
    ok = isinstance(answer, dict) and all(isinstance(v, int | float) for v in answer.values())
    mine = {k: float(v) for k, v in answer.items()} if ok else {}
    answered = sorted(set(mine) & set(truth))
    out = [Outcome("every flow answered", ok and set(mine) == set(truth),
                   f"{len(answered)} of {len(truth)} flows" if ok
                   else f"returned {type(answer).__name__}, not {{flow id: seconds}}",
                   "return {flow id: seconds out} for every flow in result['flows']")]
    if answered:
        worst = max(answered, key=lambda k: abs(mine[k] - truth[k]))
        diff = abs(mine[worst] - truth[worst])
        out.append(Outcome("seconds out per flow", diff <= TOLERANCE_S,
                           f"largest difference {diff:.3f} s (flow {worst}: yours "
                           f"{mine[worst]:.3f}, the lab's {truth[worst]:.3f}; "
                           f"want <= {TOLERANCE_S} s)",
                           "count each 0.1 s interval ending after the first fault in which "
                           "the flow received under a tenth of its offered_bps"))
    else:
        out.append(Outcome("seconds out per flow", False, "no flow to compare",
                           "read iperf3/<flow>.server.json of each flow"))
    return out


EXERCISE = Exercise(
    name="outage", lesson="ecmp-faults", file="outage.py",
    kind="analysis", scenario="ecmp-faults", policy="hash5", seed=1,
    function="outages", given=given, checks=checks)
