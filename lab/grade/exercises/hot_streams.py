"""streaming-incident: which streams cross the hot uplink, from the routers' counters alone.

The article's fix was per-stream end-to-end monitoring: for every stream, the path it took
and its loss per hop. The answer gets the reference run's incident (real media) with every
derived answer taken out - each stream's uplinks, path, probe and stalls, and the phase's
hottest uplink - keeping what an operator's counters say: each router port's bytes and
queue drops (``links``) and each stream's bytes per router interface as the routers'
nftables counted them (``router_hops``: link, sent, arrived). The lab's own per-stream
paths are what it is checked against.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab.grade.exercise import Exercise, Outcome

#: What the answer must not be given: the lab's conclusions, per stream and per phase.
DERIVED = ("uplinks", "full_path", "probe", "stalls", "stall_s", "playout", "lost_pct",
           "frames_lost", "loss")


def given(run_dir: Path, scratch: Path) -> Path:
    """The incident's links and streams, counters only."""
    result = json.loads((run_dir / "result.json").read_text())
    flows = []
    for f in result["flows"]:
        flows.append({k: v for k, v in f.items() if k not in DERIVED})
    path = scratch / "result.json"
    path.write_text(json.dumps({"phase": result.get("phase"), "links": result["links"],
                                "flows": flows}))
    return path


def truth(result: dict[str, Any]) -> tuple[str, list[str]]:
    """The incident's hottest uplink and the streams the lab traced across it."""
    hot = result["metrics"]["phases"]["incident"]["hottest_uplink"]
    return hot, sorted(f["id"] for f in result["flows"] if hot in f["uplinks"])


def checks(answer: Any, result: dict[str, Any]) -> list[Outcome]:
    hot, streams = truth(result)
    ok = isinstance(answer, list | tuple) and all(isinstance(x, str) for x in answer)
    mine = sorted(answer) if ok else []
    return [Outcome("streams on the hot uplink", ok and mine == streams,
                    f"yours {mine if ok else type(answer).__name__}, the counters say "
                    f"{streams} (on {hot})",
                    "find the uplink port (role uplink, a border's) with queue drops and "
                    "the most bytes; a stream crosses it when its router_hops name that "
                    "link with bytes sent")]


EXERCISE = Exercise(
    name="hot-streams", lesson="streaming-incident", file="hot_streams.py",
    kind="analysis", scenario="streaming-incident", policy="ovs-select", seed=1,
    sets=("phases=before-upgrade,incident",),
    function="hot_streams", given=given, checks=checks)
