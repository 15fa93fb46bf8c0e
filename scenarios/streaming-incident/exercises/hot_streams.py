"""Exercise: which streams cross the hot uplink? From the routers' counters alone (skeleton).

Every link and BGP session is up, and the viewers stall. You get the incident's counters: each
router port's bytes and queue drops (``result["links"]``: ``name``, ``role``, ``node``,
``tx_bytes``, ``drops``, ``util_mean``) and, for each stream, the bytes each router counted
sending it out of an interface and the far router counted receiving it
(``result["flows"][i]["router_hops"]``: ``link``, ``sent``, ``arrived``). The lab's own
conclusions (each stream's uplinks, its path, its stalls) are not there.

Return the ids of the streams whose packets crossed the congested uplink, e.g.
``["incident/big5", ...]``.

    python scenarios/streaming-incident/exercises/hot_streams.py result.json

Then check yourself against ``fabriclab diagnose``. A solution is in ../solutions/.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

EXERCISE = "hot-streams"     # `fabriclab grade` finds the exercise by this line


def hot_streams(result: dict[str, Any]) -> list[str]:
    # TODO: 1. the hot uplink: a border's port (role "uplink") that dropped and carried most.
    #       2. the streams with a router hop on that link that sent bytes.
    return []


if __name__ == "__main__":
    print(hot_streams(json.loads(Path(sys.argv[1]).read_text())))
