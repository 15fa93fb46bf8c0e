"""Solution: each flow's time out, from the receivers' 0.1 s intervals.

An interval counts when it ends after the first fault and the flow received under a tenth
of its offered rate in it. The lab computes the same (``lab/workloads/faults.py``); the lesson's
test checks that both agree on a real run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

EXERCISE = "outage"     # `fabriclab grade` finds the exercise by this line


def outages(run_dir: Path) -> dict[str, float]:
    result = json.loads((run_dir / "result.json").read_text())
    first_fault = min(f["at_s"] for f in result["faults"]["injected"])
    duration = float(result["params"]["duration"])
    out = {}
    for flow in result["flows"]:
        server = json.loads((run_dir / "iperf3" / f"{flow['id']}.server.json").read_text())
        total = 0.0
        for iv in server["intervals"]:
            s = iv["sum"]
            dt = s["end"] - s["start"]
            if s["end"] <= first_fault or dt <= 0 or s["end"] > duration + 0.1:
                continue
            if s["bytes"] * 8 / dt < 0.1 * flow["offered_bps"]:
                total += dt
        out[flow["id"]] = round(total, 3)
    return out


if __name__ == "__main__":
    for flow, seconds in sorted(outages(Path(sys.argv[1])).items()):
        print(f"{flow}: out {seconds:.1f} s")
