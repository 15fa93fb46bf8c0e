"""Solution: the root is the port that sent most PAUSE among those never paused; the ring's
QPs are the RoCE flows between two of its job's hosts; each leaves through its sender's
NIC, one port per switch of its path, the last towards its receiver; the paused ones of
those ports held it.

PFC holds a priority, not a flow: a QP waits at every paused port it leaves through,
whoever's congestion paused it. So a QP that never crosses the root is held all the same
(head-of-line blocking), and a ring waits for its slowest hop.
"""

from __future__ import annotations

import json
import sys
from itertools import pairwise
from pathlib import Path
from typing import Any

EXERCISE = "held-ring"      # `fabriclab grade` finds the exercise by this line

PRIORITY = "3"              # RoCE's lossless priority
ROCE_PORT = 4791            # RoCEv2's UDP destination port


def ports_towards(topology: dict[str, Any]) -> dict[tuple[str, str], str]:
    """{(node, neighbour): the node's port device towards the neighbour}, both ways."""
    out = {}
    for ln in topology["links"]:
        out[ln["a"], ln["b"]] = f"{ln['a']}-eth{ln['a_port']}"
        out[ln["b"], ln["a"]] = f"{ln['b']}-eth{ln['b_port']}"
    return out


def egress(flow: dict[str, Any], towards: dict[tuple[str, str], str]) -> list[str]:
    """The ports a flow's packets left through: its sender's NIC, each switch of its path."""
    hops = [flow["src"], *(flow.get("path") or []), flow["dst"]]
    if len(hops) < 3:             # no counted path: nothing known of where it went
        return []
    return [towards[a, b] for a, b in pairwise(hops) if (a, b) in towards]


def held_ring(given: dict[str, Any]) -> dict[str, Any]:
    prio = {p["dev"]: p["priorities"].get(PRIORITY, {}) for p in given["pfc"]["ports"]}
    sent = {d for d, c in prio.items() if c.get("pause_frames_tx", 0) > 0}
    paused = {d: c.get("paused_ns", 0) / 1e9 for d, c in prio.items()
              if c.get("pause_frames_rx", 0) > 0}
    # of two roots, the one that sent most PAUSE is where the pauses spread from
    roots = sorted(sent - set(paused), key=lambda d: (-prio[d]["pause_frames_tx"], d))
    root = roots[0] if roots else None
    sched = given["scheduler"]
    job = set(sched.get("jobs", {}).get(sched.get("job"), []))
    towards = ports_towards(given["topology"])
    ring = [f for f in given["flows"] if f["src"] in job and f["dst"] in job
            and f["proto"] == "udp" and f["dport"] == ROCE_PORT]
    crossed = {p for f in ring for p in egress(f, towards)}
    return {"root": root, "crosses_root": root in crossed,
            "paused": {p: round(s, 3) for p, s in sorted(paused.items()) if p in crossed}}


if __name__ == "__main__":
    print(held_ring(json.loads(Path(sys.argv[1]).read_text())))
