"""Exercise: how long was each flow out? Read it from the receivers (skeleton).

The switches say a link went down; the application only knows when its bytes stopped
arriving. Every flow's iperf3 server wrote what it received per 0.1 s to
``iperf3/<flow>.server.json`` in the run directory (``intervals[i]["sum"]`` has ``start``,
``end`` and ``bytes``). Return, per flow id, the seconds it spent *out* from the first
fault on: intervals in which it received less than a tenth of its offered rate
(``offered_bps`` of the flow in result.json).

    python scenarios/ecmp-faults/exercises/outage.py results/<run>

Then compare with the lab's own answer: ``out_s`` of each flow in result.json, and ask why
the flows that crossed no failed link were out at all (hint: ACKs take a path too).
A solution is in ../solutions/.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

EXERCISE = "outage"     # `fabriclab grade` finds the exercise by this line


def outages(run_dir: Path) -> dict[str, float]:
    result = json.loads((run_dir / "result.json").read_text())
    first_fault = min(f["at_s"] for f in result["faults"]["injected"])  # noqa: F841
    # TODO: for each flow in result["flows"], read run_dir / "iperf3" / f"{id}.server.json"
    return {}


if __name__ == "__main__":
    for flow, seconds in sorted(outages(Path(sys.argv[1])).items()):
        print(f"{flow}: out {seconds:.1f} s")
