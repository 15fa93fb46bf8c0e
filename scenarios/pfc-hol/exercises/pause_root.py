"""Exercise: where did the pauses start, and how far did they spread? (skeleton)

A switch's PFC counters are per port and priority: PAUSE frames sent (its queue passed
XOFF), PAUSE frames received (it was told to stop), time paused. Given the ``pfc`` phase's
counters and the topology, return the port whose queue started it all and the number of
hops the pauses reached upstream of it, e.g. ``("leaf1-eth1", 3)``.

    python scenarios/pfc-hol/exercises/pause_root.py given.json

``given["pfc"]["ports"]``: one entry per port, ``{"dev": "spine1-eth1", "priorities": {"3":
{"pause_frames_tx", "pause_frames_rx", "paused_ns", ...}}}``; a host's NIC is ``h5-eth0``.
``given["topology"]["links"]``: ``{"a", "a_port", "b", "b_port", ...}``; port ``P`` of node
``N`` is the device ``N-ethP``. Hints in the lesson's questions; a solution in ../solutions/.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

EXERCISE = "pause-root"     # `fabriclab grade` finds the exercise by this line


def pause_root(given: dict[str, Any]) -> tuple[str | None, int]:
    # TODO: the root sent PAUSE and was never paused; then walk upstream, feeder by feeder.
    return None, 0


if __name__ == "__main__":
    print(pause_root(json.loads(Path(sys.argv[1]).read_text())))
