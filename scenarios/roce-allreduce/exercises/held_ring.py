"""Exercise: did the incast's pauses hold the ring, and where? (skeleton)

With PFC alone, the incast's receiver port pauses its feeders and the pauses spread
upstream. Given the ``pfc`` phase's switch counters, the scheduler's map and the flows,
return where the pauses started, whether any of the ring's QPs leaves through that port,
and every paused port on the ring's paths with the seconds it was paused:

    {"root": "spine1-eth2", "crosses_root": True, "paused": {"h5-eth0": 1.25, ...}}

    python scenarios/roce-allreduce/exercises/held_ring.py given.json

``given["pfc"]["ports"]``: one entry per port, ``{"dev": "spine1-eth1", "priorities": {"3":
{"pause_frames_tx", "pause_frames_rx", "paused_ns", ...}}}``; a host's NIC is ``h5-eth0``.
``given["topology"]["links"]``: ``{"a", "a_port", "b", "b_port", ...}``; port ``P`` of node
``N`` is the device ``N-ethP``. ``given["scheduler"]``: ``{"job": the ring's job, "jobs":
{job: [hosts]}}``. ``given["flows"]``: ``{"src", "dst", "src_ip", "dst_ip", "proto",
"sport", "dport", "path"}`` with ``path`` the switches the flow's packets crossed, in order.
Hints in the lesson's questions; a solution in ../solutions/.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

EXERCISE = "held-ring"      # `fabriclab grade` finds the exercise by this line


def held_ring(given: dict[str, Any]) -> dict[str, Any]:
    # TODO: the root sent PAUSE and was never paused; the ring's QPs are the job's RoCE
    # flows; list the ports each leaves through, and keep those that were paused.
    return {"root": None, "crosses_root": None, "paused": {}}


if __name__ == "__main__":
    print(held_ring(json.loads(Path(sys.argv[1]).read_text())))
