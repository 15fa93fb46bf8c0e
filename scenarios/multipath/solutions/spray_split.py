"""Solution: a 5-tuple's bytes cross the uplink from the first switch of its path to the
second; summing them per uplink gives what the uplink's own port counted (nothing else
crossed it), and the imbalance is the largest over the mean.

Every uplink the senders' leaf has is counted, carried bytes or not: an idle uplink is
what makes a collision's imbalance large.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

EXERCISE = "spray-split"    # `fabriclab grade` finds the exercise by this line


def spray_split(given: dict[str, Any]) -> dict[str, Any]:
    topo = given["topology"]
    role = {s["name"]: s["role"] for s in topo["switches"]}
    starts = {f["path"][0] for f in given["flows"] if f["path"]}
    leaf = min(s for s in starts if role.get(s) == "leaf")
    spines = {ln["b"] if ln["a"] == leaf else ln["a"] for ln in topo["links"]
              if leaf in (ln["a"], ln["b"]) and role.get(ln["b"] if ln["a"] == leaf
                                                          else ln["a"]) == "spine"}
    up = {f"{leaf}->{s}": 0 for s in sorted(spines)}
    for f in given["flows"]:
        p = f["path"]
        if len(p) > 1 and p[0] == leaf and f"{leaf}->{p[1]}" in up:
            up[f"{leaf}->{p[1]}"] += f["bytes"]
    mean = sum(up.values()) / len(up)
    return {"uplinks": up, "imbalance": round(max(up.values()) / mean, 4) if mean else 0.0}


if __name__ == "__main__":
    print(spray_split(json.loads(Path(sys.argv[1]).read_text())))
