"""Exercise: find the congested uplink from counters alone (skeleton).

An operator has the switches' port counters and nothing else: no flow table, no idea which
application sent what. Given a run's result.json, return the name ("leaf1->spine2") of the
uplink that congested, or None if none did, using only ``result["links"]``: each has
``node``, ``peer``, ``tx_bytes``, ``drops``, ``util_mean``, ``bw_mbps`` and a time series.

    python scenarios/ecmp-basic/exercises/congested_uplink.py results/<run>/result.json

Then check your answer against the flows: which flows' ``path`` crosses that link?
Hints: an uplink is a link from a leaf to a spine. Congested means its queue overflowed
(drops) or it ran at its rate. A solution is in ../solutions/.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

EXERCISE = "congested-uplink"     # `fabriclab grade` finds the exercise by this line


def congested_uplink(result: dict[str, Any]) -> str | None:
    # TODO: look at result["links"] only.
    return None


if __name__ == "__main__":
    print(congested_uplink(json.loads(Path(sys.argv[1]).read_text())))
