"""gpu-wait: who made the GPUs wait, per phase, from the measurements alone.

The answer gets the reference run's result as ``lab.analysis.gpuwait.stripped`` leaves it:
every phase renamed (``p0``, ``p1``, ...) in an order seeded by the run's own numbers, the
scenario's settings, the lab's diagnosis and the run's timings gone. It returns, per phase,
the causes it names. Each phase is checked against what the scenario injected there
(``INJECTED``, keyed by the phase's real name, which the grader knows and the answer does
not); a wrong phase's hint is the lab's own evidence for that phase, so the set of causes
is the diagnosis's (``gpuwait.FIXES``) and a new one needs nothing here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab.analysis import gpuwait
from lab.grade.exercise import Exercise, Outcome

#: What each phase of scenarios/gpu-wait injects: the ground truth, keyed by the phase's
#: name (causes from ``gpuwait.FIXES``; none for a healthy phase). The one definition: the
#: scenario's integration test and a unit test (every phase of the scenario is here) use it.
INJECTED: dict[str, list[str]] = {
    "healthy": [], "cpu": ["cpu"], "data": ["data"], "placement": ["placement"],
    "network": ["network"], "wrong-nic": ["interface"], "straggler": ["straggler"],
    "racks": [], "two-jobs": ["other-job"], "job-aware": [], "mixed": ["data", "interface"]}


def given(run_dir: Path, scratch: Path) -> Path:
    """The reference run's result.json, stripped of its phase names and settings."""
    result = json.loads((run_dir / "result.json").read_text())
    path = scratch / "result.json"
    path.write_text(json.dumps(gpuwait.stripped(result)["result"]))
    return path


def _causes(value: Any) -> list[str] | None:
    """An answer's causes for one phase as a list of names, or None when it is not one."""
    if value is None:
        return []
    if isinstance(value, list | tuple) and all(isinstance(c, str) for c in value):
        return list(value)
    return None


def _hint(missed: list[str], extra: list[str], diag: dict[str, Any]) -> str:
    """What the lab measured for the causes the answer got wrong, in its own words."""
    by = {c["cause"]: c for c in diag["causes"]}
    parts = [f"{c}: {by[c]['evidence']}" if c in by else f"{c}: not a cause the lab "
             f"measures" for c in missed]
    parts += [f"{c} held only {by[c]['share_of_step'] * 100:.0f}% of the step" if c in by
              else f"{c} is not a cause the lab names (it names: {', '.join(gpuwait.FIXES)})"
              for c in extra]
    if not parts:
        return ""
    return ("; ".join(parts) + f" (a cause is named from "
            f"{gpuwait.NAMED_MIN_SHARE * 100:.0f}% of the critical rank's step)")


def checks(answer: Any, result: dict[str, Any]) -> list[Outcome]:
    """One check per phase: the causes named, as a set, are the ones injected."""
    s = gpuwait.stripped(result)
    diagnosis = gpuwait.diagnose(s["result"])
    if not isinstance(answer, dict):
        return [Outcome("a dict of phases", False, f"returned {type(answer).__name__}",
                        'return {phase: [causes]} for every phase, e.g. {"p0": ["cpu"]}')]
    out = []
    for name, alias in sorted(s["alias"].items(), key=lambda kv: int(kv[1][1:])):
        check = f"phase {alias}"
        truth = INJECTED.get(name)
        if truth is None:
            out.append(Outcome(check, False, f"the lab does not know what phase {name!r} "
                               "injects", "the lab's fault, not yours: add the phase to "
                               "lab/grade/exercises/who_waited.py's INJECTED"))
            continue
        if alias not in answer:
            out.append(Outcome(check, False, "no answer for it",
                               "answer every phase of result['metrics']['phases']"))
            continue
        mine = _causes(answer[alias])
        if mine is None:
            out.append(Outcome(check, False, f"yours {answer[alias]!r}, not a list of "
                               "cause names", f"a list of names from "
                               f"{', '.join(gpuwait.FIXES)}; [] for none"))
            continue
        missed = sorted(set(truth) - set(mine))
        extra = sorted(set(mine) - set(truth))
        lab = diagnosis.get(alias, {"causes": []})
        out.append(Outcome(check, not missed and not extra,
                           f"yours {sorted(set(mine))}, injected {truth} (it was phase "
                           f"{name!r})", _hint(missed, extra, lab)))
    return out


EXERCISE = Exercise(
    name="who-waited", lesson="gpu-wait", file="who_waited.py",
    kind="analysis", scenario="gpu-wait", policy="job-aware", seed=1,
    function="who_waited", given=given, checks=checks)
