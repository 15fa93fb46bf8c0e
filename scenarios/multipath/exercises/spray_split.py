"""Exercise: how did the sprayed QPs' bytes split over the uplinks? (skeleton)

Every sprayed QP is many 5-tuples, one per source port, each hashed on its own. Given the
``sprayed-ooo`` phase's per-flow counters, return each uplink's bytes on the senders' leaf
and their imbalance (the largest over the mean):

    {"uplinks": {"leaf1->spine1": 123456, ...}, "imbalance": 1.04}

    python scenarios/multipath/exercises/spray_split.py given.json

``given["flows"]``: ``{"src", "dst", "src_ip", "dst_ip", "proto", "sport", "dport", "path",
"bytes"}``, ``path`` the switches the 5-tuple's packets crossed, in order, ``bytes`` what
its first switch counted. ``given["topology"]``: ``{"switches": [{"name", "role"}],
"hosts": [...], "links": [{"a", "b", ...}]}``. Hints in the lesson; a solution in
../solutions/.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

EXERCISE = "spray-split"    # `fabriclab grade` finds the exercise by this line


def spray_split(given: dict[str, Any]) -> dict[str, Any]:
    # TODO: for every flow whose path leaves a leaf for a spine, add its bytes to that
    # uplink; then the imbalance of the uplinks of the leaf the senders are on.
    return {"uplinks": {}, "imbalance": None}


if __name__ == "__main__":
    print(spray_split(json.loads(Path(sys.argv[1]).read_text())))
