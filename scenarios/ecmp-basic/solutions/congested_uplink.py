"""Solution: the leaf->spine port that dropped, else the one that ran at its rate.

Drops at a port are the queue overflowing: the unambiguous sign. Without drops (a deep
queue, or ECN holding it short), a port whose mean utilisation is within 5 % of its rate was
the bottleneck. Among several, the one with the most drops (then the highest utilisation) is
the one to fix first.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

EXERCISE = "congested-uplink"     # `fabriclab grade` finds the exercise by this line

BUSY = 0.95          # mean utilisation from which a port counts as saturated


def congested_uplink(result: dict[str, Any]) -> str | None:
    roles = {s["name"]: s["role"] for s in result["topology"]["switches"]}
    uplinks = [ln for ln in result["links"]
               if roles.get(ln["node"]) == "leaf" and roles.get(ln["peer"]) == "spine"]
    hot = [ln for ln in uplinks if ln["drops"] > 0 or ln["util_mean"] >= BUSY]
    if not hot:
        return None
    worst = max(hot, key=lambda ln: (ln["drops"], ln["util_mean"]))
    return f"{worst['node']}->{worst['peer']}"


if __name__ == "__main__":
    print(congested_uplink(json.loads(Path(sys.argv[1]).read_text())))
