"""The loop the scenario benches share: run `fabriclab run` as a user would, read its
result.json, make a row of what the bench measures, judge it against the wall-time target
and fidelity, print it, and write every row as JSON at the end.

A bench says only what it measures (``measure``) and how it prints its own part
(``show``); the run, the timing, the judgement and the output are here, once.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FABRICLAB = [sys.executable, "-m", "lab.cli"]

#: (scenario, its output folder, wall seconds, its result.json) -> the bench's row.
Measure = Callable[[str, Path, float, dict[str, Any]], dict[str, Any]]


def run_scenario(scenario: str, out: Path, *args: str) -> tuple[float, dict[str, Any]]:
    """`fabriclab run SCENARIO --out OUT ARGS` through the CLI: its wall time and result."""
    t0 = time.monotonic()
    subprocess.run([*FABRICLAB, "run", scenario, "--out", str(out), *args], check=True,
                   cwd=REPO, stdout=subprocess.DEVNULL)
    return time.monotonic() - t0, json.loads((out / "result.json").read_text())


def arguments(doc: str | None, scenarios: Sequence[str] | None = None,
              runs: bool = True) -> argparse.Namespace:
    """``--json FILE``; ``--runs N`` where a bench repeats; ``--scenarios A B ...`` where it
    has several."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n", 1)[0])
    if runs:
        ap.add_argument("--runs", type=int, default=1)
    if scenarios is not None:
        ap.add_argument("--scenarios", nargs="*", default=list(scenarios))
    ap.add_argument("--json")
    return ap.parse_args()


def base_row(scenario: str, wall: float, result: dict[str, Any]) -> dict[str, Any]:
    """What every bench row holds: the scenario, its wall time and its fidelity."""
    return {"scenario": scenario, "wall_s": round(wall, 1),
            "cpu_idle_min_pct": result["fidelity"]["cpu_idle_min_pct"],
            "fidelity_valid": result["fidelity"]["valid"]}


def each_run(scenarios: Iterable[str], runs: int, measure: Measure,
             show: Callable[[dict[str, Any]], None], *args: str) -> list[dict[str, Any]]:
    """Every scenario ``runs`` times (in a temporary folder): one measured row a run,
    shown as soon as it is made."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in scenarios:
            for i in range(runs):
                out = Path(tmp) / f"{name}-{i}"
                wall, result = run_scenario(name, out, *args)
                rows.append(measure(name, out, wall, result))
                show(rows[-1])
    return rows


def met(row: dict[str, Any], target_s: float) -> bool:
    """Within the wall-time target, with fidelity valid."""
    return row["wall_s"] <= target_s and bool(row["fidelity_valid"])


def headline(row: dict[str, Any], target_s: float, tail: str) -> str:
    """``NAME: W s wall (ok|MISSED; target T s, fidelity valid|INVALID), min CPU idle I%,
    TAIL``: a row's first line, the same in every bench."""
    fid = "valid" if row["fidelity_valid"] else "INVALID"
    return (f"{row['scenario']}: {row['wall_s']:.1f} s wall "
            f"({'ok' if met(row, target_s) else 'MISSED'}; target {target_s:g} s, fidelity "
            f"{fid}), min CPU idle {row['cpu_idle_min_pct']:.0f}%, {tail}")


def finish(json_path: str | None, payload: object, ok: bool) -> int:
    """Write ``payload`` to ``--json`` where given; the exit status (1: a target missed)."""
    if json_path:
        Path(json_path).write_text(json.dumps(payload, indent=1))
    return 0 if ok else 1
