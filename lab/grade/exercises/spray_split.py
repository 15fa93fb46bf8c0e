"""multipath: how a sprayed phase's bytes split over the senders' uplinks, from the
switches' per-flow counters alone.

A sprayed QP is hundreds of 5-tuples, each hashed on its own. The answer gets what an
operator's per-flow telemetry gives for the ``sprayed-ooo`` phase: the topology and every
5-tuple with the switches its packets crossed and its bytes, without the lab's labels. It
returns each uplink's bytes (``leaf1->spine2``) and their imbalance (max/mean). It is checked
against the uplinks' own port counters, which per-flow bytes must add up to, and the
imbalance the run reports (``lab.analysis.uplinks``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab.analysis import uplinks
from lab.grade.exercise import Exercise, Outcome

#: The phase the answer reads: sprayed, with out-of-order placement.
PHASE = "sprayed-ooo"
FLOW_KEYS = ("src", "dst", "src_ip", "dst_ip", "proto", "sport", "dport", "path", "bytes")
#: How far an uplink's bytes may be from its port counter (packets the lab sent on it that
#: are no QP's: none in this phase, so a rounding margin).
BYTES_TOLERANCE = 0.01
IMBALANCE_TOLERANCE = 0.005
EXAMPLE = '{"uplinks": {"leaf1->spine1": 123456, ...}, "imbalance": 1.04}'


def given(run_dir: Path, scratch: Path) -> Path:
    """The topology and the phase's flows: 5-tuple, path, bytes, sorted by 5-tuple."""
    result = json.loads((run_dir / "result.json").read_text())
    flows = sorted(({k: f.get(k) for k in FLOW_KEYS}
                    for f in result["phase_details"][PHASE]["flows"]),
                   key=lambda f: (str(f["src_ip"]), str(f["dst_ip"]), f["sport"] or 0))
    path = scratch / "result.json"
    path.write_text(json.dumps({"topology": result["topology"], "flows": flows}))
    return path


def _shape(answer: Any) -> str | None:
    if not isinstance(answer, dict) or "uplinks" not in answer or "imbalance" not in answer:
        return "not a {uplinks, imbalance} dict"
    if not isinstance(answer["uplinks"], dict) or not all(
            isinstance(b, int | float) and not isinstance(b, bool)
            for b in answer["uplinks"].values()):
        return f"uplinks is {answer['uplinks']!r}, not a {{uplink: bytes}} dict"
    return None


def checks(answer: Any, result: dict[str, Any]) -> list[Outcome]:
    """Each uplink's bytes against its port counter; the imbalance against the run's."""
    details = result["phase_details"][PHASE]
    split = result["metrics"]["phases"][PHASE]["split"]
    truth = {name: ln["tx_bytes"] for name, ln in
             uplinks.of(details["links"], result["topology"], split["switch"]).items()}
    why = _shape(answer)
    if why is not None:
        return [Outcome("a {uplinks, imbalance} dict", False, why, f"return e.g. {EXAMPLE}")]
    mine = {str(k): float(v) for k, v in answer["uplinks"].items()}
    off = sorted(n for n in truth
                 if abs(mine.get(n, 0.0) - truth[n]) > BYTES_TOLERANCE * max(truth[n], 1))
    imb = answer["imbalance"]
    imb_ok = isinstance(imb, int | float) and not isinstance(imb, bool) and \
        abs(imb - split["imbalance"]) <= IMBALANCE_TOLERANCE
    return [
        Outcome("each uplink's bytes", not off and set(mine) == set(truth),
                f"{len(truth) - len(off)} of {len(truth)} uplinks within "
                f"{BYTES_TOLERANCE * 100:g}% of their port counters"
                + ("; off: " + ", ".join(f"{n} (yours {mine.get(n, 0):.0f}, the port's "
                                         f"{truth[n]})" for n in off[:3]) if off else ""),
                f"an uplink is named {split['switch']}->SPINE; it carries the bytes of every "
                "5-tuple whose path goes from that leaf to that spine"),
        Outcome("the imbalance (max/mean)", imb_ok,
                f"yours {imb!r}, the run's {split['imbalance']}",
                "the largest uplink's bytes over the mean of the uplinks' bytes"),
    ]


EXERCISE = Exercise(
    name="spray-split", lesson="multipath", file="spray_split.py",
    kind="analysis", scenario="multipath", policy="hash5", seed=2,
    function="spray_split", given=given, checks=checks)
