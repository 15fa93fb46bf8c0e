"""ecmp-basic: name the congested uplink from the switches' port counters alone.

The answer gets the reference run's result.json without its flows (an operator's view); the
lab's per-flow diagnosis of the same run (``fabriclab diagnose``) is what it is checked
against.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab.analysis import diagnose
from lab.grade.exercise import Exercise, Outcome


def given(run_dir: Path, scratch: Path) -> Path:
    """result.json with the flows taken out: counters alone."""
    result = json.loads((run_dir / "result.json").read_text())
    result.pop("flows")
    path = scratch / "result.json"
    path.write_text(json.dumps(result))
    return path


def checks(answer: Any, result: dict[str, Any]) -> list[Outcome]:
    truth = diagnose.diagnose(result)["congested_link"]
    return [Outcome("congested uplink", answer == truth,
                    f"yours {answer!r}, the flows' own losses say {truth!r}",
                    "an uplink goes from a leaf to a spine; congested means its queue "
                    "dropped (drops > 0) or it ran at its rate (util_mean near 1)")]


EXERCISE = Exercise(
    name="congested-uplink", lesson="ecmp-basic", file="congested_uplink.py",
    kind="analysis", scenario="ecmp-basic", policy="hash-l3", seed=1, duration=3.0,
    function="congested_uplink", given=given, checks=checks)
