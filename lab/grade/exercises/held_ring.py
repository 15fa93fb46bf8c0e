"""roce-allreduce: where did the pauses start, did the ring cross that port, and which ports
on the ring's paths did PFC hold, and for how long.

The answer gets what an operator has for the ``pfc`` phase: the topology, pfcd's counters
per port and priority, the scheduler's map of hosts to jobs, and each flow's 5-tuple with
the switches its packets crossed (the switches' per-flow counters), without the lab's
labels on the flows (``id``, ``kind``, ``rank``...): which flows are the ring's is the
scheduler's map and the RoCE port to read, as the diagnosis reads them. It returns the root
of the pauses, whether any of the ring's QPs leaves through it, and the paused ports on the
ring's paths with their seconds. It is checked against the lab's own reading of the same
counters, the one ``fabriclab diagnose`` prints (``lab.analysis.gpuwait.job_pauses``, that
is ``lab.analysis.pauses.held`` over the job's flows).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab.analysis import gpuwait
from lab.grade.exercise import Exercise, Outcome

#: The phase whose pauses the answer reads: PFC alone, the incast's port pausing.
PHASE = "pfc"
#: What a flow record keeps: its 5-tuple, its ends' names (the scheduler's map names hosts)
#: and its path. The lab's labels would name the ring's flows outright.
FLOW_KEYS = ("src", "dst", "src_ip", "dst_ip", "proto", "sport", "dport", "path")
#: How far an answer's seconds paused may be from the lab's (which rounds to the ms).
SECONDS_TOLERANCE = 0.01

#: The answer's shape, in the hint of an answer of another shape (not this run's answer).
EXAMPLE = '{"root": "spine1-eth2", "crosses_root": True, "paused": {"h5-eth0": 1.25, ...}}'


def given(run_dir: Path, scratch: Path) -> Path:
    """The topology, and the ``pfc`` phase's PFC counters, scheduler map and flows (5-tuple
    and path only, in an order that says nothing of whose they are)."""
    result = json.loads((run_dir / "result.json").read_text())
    details = result["phase_details"][PHASE]
    flows = sorted(({k: f.get(k) for k in FLOW_KEYS} for f in details.get("flows", [])),
                   key=lambda f: (str(f["src_ip"]), str(f["dst_ip"]), f["sport"] or 0))
    path = scratch / "result.json"
    path.write_text(json.dumps({"topology": result["topology"], "pfc": details["pfc"],
                                "scheduler": details.get("scheduler") or {},
                                "flows": flows}))
    return path


def _shape(answer: Any) -> str | None:
    """Why the answer is not a {root, crosses_root, paused} dict, or None when it is one."""
    if not isinstance(answer, dict):
        return f"returned {type(answer).__name__}"
    missing = [k for k in ("root", "crosses_root", "paused") if k not in answer]
    if missing:
        return f"no {', '.join(missing)} in it"
    paused = answer["paused"]
    if not (isinstance(paused, dict) and all(
            isinstance(s, int | float) and not isinstance(s, bool) for s in paused.values())):
        return f"paused is {paused!r}, not a {{port: seconds}} dict"
    return None


def _some(ports: list[str], shown: int = 4) -> str:
    """A few ports by name and how many more: a hint, not the whole answer."""
    more = len(ports) - shown
    return ", ".join(ports[:shown]) + (f" and {more} more" if more > 0 else "")


def _seconds(paused: dict[str, float], truth: dict[str, float], share: float) -> Outcome:
    """The seconds of each paused port the answer and the lab share, and the longest: a
    ring waits for its slowest hop, the diagnosis's measure of how long PFC held it."""
    check = "how long PFC held the ring"
    hint = ("pfcd's paused_ns of the port, in seconds; the longest is what the ring "
            "waited for (its slowest hop)")
    if not truth:
        return Outcome(check, not paused, f"yours {len(paused)} ports, the lab's none: PFC "
                       "paused no port on the ring's paths", hint)
    lab = max(truth, key=lambda p: truth[p])
    if not paused:
        return Outcome(check, False, f"yours no port, the lab's longest {truth[lab]:.3f} s "
                       f"({lab}), {share * 100:.0f}% of the phase", hint)
    mine = max(paused, key=lambda p: paused[p])
    off = sorted(p for p in set(paused) & set(truth)
                 if abs(paused[p] - truth[p]) > SECONDS_TOLERANCE)
    ok = not off and abs(paused[mine] - truth[lab]) <= SECONDS_TOLERANCE
    measured = (f"the longest: yours {paused[mine]:.3f} s ({mine}), the lab's "
                f"{truth[lab]:.3f} s ({lab}), {share * 100:.0f}% of the phase")
    if off:
        at = ", ".join(f"{p} (yours {paused[p]:.3f}, the lab's {truth[p]:.3f})"
                       for p in off[:3])
        measured += f"; off by more than {SECONDS_TOLERANCE:g} s at {at}"
    return Outcome(check, ok, measured, hint)


def checks(answer: Any, result: dict[str, Any]) -> list[Outcome]:
    """The root, whether the ring crossed it, the paused ports on its paths, their seconds."""
    held = gpuwait.job_pauses(result["phase_details"][PHASE], result["topology"])
    if held is None:
        return [Outcome("the reference run", False, f"its {PHASE} phase has no PFC counters "
                        "or no RoCE flow of the job", "the lab's fault, not yours")]
    why = _shape(answer)
    if why is not None:
        return [Outcome("a {root, crosses_root, paused} dict", False, why,
                        f"return e.g. {EXAMPLE}")]
    root = held["roots"][0] if held["roots"] else None
    truth = held["job_paused_ports"]
    mine = {str(p) for p in answer["paused"]}
    missing, extra = sorted(set(truth) - mine), sorted(mine - set(truth))
    return [
        Outcome("the root of the pauses", answer["root"] == root,
                f"yours {answer['root']!r}, the lab's {root!r}",
                "a root sent PAUSE (pause_frames_tx > 0) and was never paused itself "
                "(pause_frames_rx == 0): its own queue passed XOFF; of two such ports, the "
                "one that sent most PAUSE"),
        Outcome("the ring crosses the root", answer["crosses_root"] is held["crossed_root"],
                f"yours {answer['crosses_root']!r}, the lab's {held['crossed_root']!r} "
                f"(the roots the ring's QPs leave through: "
                f"{', '.join(held['crossed_roots']) or 'none'})",
                "True when one of the ring's QPs leaves through the root's port (its own "
                "traffic in the congested queue); False is head-of-line blocking. Crossing "
                "another root, one that sent a few PAUSE, is not crossing this one"),
        Outcome("the paused ports on the ring's paths", not missing and not extra,
                f"{len(mine & set(truth))} of the lab's {len(truth)}"
                + (f"; missing {_some(missing)}" if missing else "")
                + (f"; not on the ring's paths or not paused: {_some(extra)}"
                   if extra else ""),
                "the ring's QPs are the RoCE flows (UDP to 4791) between two of the job's "
                "hosts; a QP leaves through its sender's NIC (h1-eth0), each switch's port "
                "towards the next switch of its path, and the last switch's port towards "
                "its receiver; a port was paused when it received PAUSE (pause_frames_rx > 0)"),
        _seconds({str(p): float(s) for p, s in answer["paused"].items()}, truth,
                 held["held_share"]),
    ]


EXERCISE = Exercise(
    name="held-ring", lesson="roce-allreduce", file="held_ring.py",
    kind="analysis", scenario="roce-allreduce", policy="hash5", seed=1,
    function="held_ring", given=given, checks=checks)
