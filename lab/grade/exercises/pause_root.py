"""pfc-hol: find the port whose queue started the pauses, and how far upstream they went,
from the switches' PFC counters alone.

The answer gets what an operator's switches would show for the ``pfc`` phase: the topology,
and per port and priority pause frames sent and received and the time paused (pfcd's
counters), nothing of the flows or of the lab's own pause tree. It returns the congested
port (``"leaf1-eth1"``) and the number of hops the pauses reached upstream of it. It is
checked against the lab's tree (``lab.analysis.pauses.pause_tree``), which reads the same
counters with the feeders pfcd was configured with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab.grade.exercise import Exercise, Outcome

#: The phase whose pauses the answer reads.
PHASE = "pfc"


def given(run_dir: Path, scratch: Path) -> Path:
    """The topology and the ``pfc`` phase's PFC counters, nothing else."""
    result = json.loads((run_dir / "result.json").read_text())
    path = scratch / "result.json"
    path.write_text(json.dumps({"topology": result["topology"],
                                "pfc": result["phase_details"][PHASE]["pfc"]}))
    return path


def checks(answer: Any, result: dict[str, Any]) -> list[Outcome]:
    tree = result["metrics"]["phases"][PHASE]["pause_tree"]
    if not (isinstance(answer, tuple | list) and len(answer) == 2):
        return [Outcome("a (port, hops) pair", False, f"returned {answer!r}",
                        'return ("leaf1-eth1", 3): the root port and the hops')]
    root, hops = answer
    truth_root = tree["roots"][0] if tree["roots"] else None
    return [
        Outcome("the root of the pauses", root == truth_root,
                f"yours {root!r}, the lab's {truth_root!r}",
                "the root sent PAUSE (pause_frames_tx > 0) but was never paused itself "
                "(pause_frames_rx == 0): its own egress queue passed XOFF; of two such "
                "ports, the one that sent most PAUSE"),
        Outcome("how far they spread", hops == tree["max_hops"],
                f"yours {hops!r}, the lab's {tree['max_hops']}",
                "a paused port is one hop further than the port it feeds; a port feeds a "
                "switch's port when its link ends at that switch (and is not the same link)"),
    ]


EXERCISE = Exercise(
    name="pause-root", lesson="pfc-hol", file="pause_root.py",
    kind="analysis", scenario="pfc-hol", policy="hash5", seed=1,
    function="pause_root", given=given, checks=checks)
