"""Solution: the root is the port that sent PAUSE and never received one; its feeders are
the far ends of its switch's other links, and each paused feeder is one hop further.

A port is watched as a switch's egress queue and paused as a feeder of the next switch, so
the same device name shows up in both roles; hosts' NICs are only ever paused.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

EXERCISE = "pause-root"     # `fabriclab grade` finds the exercise by this line

PRIORITY = "3"              # RoCE's lossless priority


def feeders(topology: dict[str, Any]) -> dict[str, list[str]]:
    """{switch port: the ports whose traffic enters its switch on another link}."""
    switches = {s["name"] for s in topology["switches"]}
    ends: dict[str, list[tuple[str, str]]] = {s: [] for s in switches}
    for ln in topology["links"]:
        for n, p, m, q in ((ln["a"], ln["a_port"], ln["b"], ln["b_port"]),
                           (ln["b"], ln["b_port"], ln["a"], ln["a_port"])):
            if n in switches:
                ends[n].append((f"{n}-eth{p}", f"{m}-eth{q}"))
    return {mine: [far for other, far in ends[sw] if other != mine]
            for sw in switches for mine, _ in ends[sw]}


def pause_root(given: dict[str, Any]) -> tuple[str | None, int]:
    prio = {p["dev"]: p["priorities"].get(PRIORITY, {}) for p in given["pfc"]["ports"]}
    sent = {d for d, c in prio.items() if c.get("pause_frames_tx", 0) > 0}
    paused = {d for d, c in prio.items() if c.get("pause_frames_rx", 0) > 0}
    # two roots: the one that sent most PAUSE is where the pauses spread from (another may
    # pass XOFF once, filled by a burst let go when a pause ended)
    roots = sorted(sent - paused, key=lambda d: (-prio[d]["pause_frames_tx"], d))
    if not roots:
        return None, 0
    feeds = feeders(given["topology"])
    hops, frontier = {roots[0]: 0}, [roots[0]]
    while frontier:
        upstream = []
        for dev in frontier:
            for f in feeds.get(dev, []):
                if f in paused and f not in hops:
                    hops[f] = hops[dev] + 1
                    upstream.append(f)
        frontier = upstream
    return roots[0], max(hops.values())


if __name__ == "__main__":
    print(pause_root(json.loads(Path(sys.argv[1]).read_text())))
