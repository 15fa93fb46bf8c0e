"""The four GPU scenarios against their speed targets.

For each scenario: wall time of `fabriclab run` with defaults (target <= 90 s on 2 cores),
minimum CPU idle (fidelity), the workers' own CPU time, and the step clock's resolution
with how closely the ranks' step ends line up (target <= 1 ms).

Usage: python bench/collective.py [--runs N] [--scenarios A B ...] [--json FILE]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from clirun import arguments, base_row, each_run, finish, headline, met

SCENARIOS = ("allreduce-ecmp", "allreduce-shared-link", "allreduce-placement", "incast-ecn")
WALL_TARGET_S = 90.0
RESOLUTION_TARGET_S = 1e-3


def worker_stats(out: Path) -> tuple[float, float]:
    """(CPU seconds of every worker, worst spread of one step's end across ranks).

    The spread is the barrier's: its tokens travel the same congested links as the data.
    """
    cpu, spread = 0.0, 0.0
    for phase in (out / "job").iterdir():
        ranks = [json.loads(p.read_text()) for p in phase.glob("rank*.json")]
        others = [json.loads(p.read_text()) for p in [*phase.glob("s*.json"),
                                                      *phase.glob("sink.json")]]
        cpu += sum(o.get("cpu_s", 0.0) for o in ranks + others)
        ends: dict[int, list[float]] = {}
        for r in ranks:
            for s in r["steps"]:
                ends.setdefault(s["step"], []).append(s["t_end"])
        spread = max([spread, *(max(v) - min(v) for v in ends.values() if len(v) > 1)])
    return cpu, spread


def measure(name: str, out: Path, wall: float, r: dict[str, Any]) -> dict[str, Any]:
    cpu, spread = worker_stats(out)
    return {**base_row(name, wall, r), "workers_cpu_s": round(cpu, 2),
            "step_end_spread_ms": round(spread * 1e3, 3),
            "phases": {p: {k: m[k] for k in ("step_p50_s", "step_p99_s", "gpu_idle_fraction",
                                              "busbw_bps", "retransmits", "ce_marked")}
                       for p, m in r["metrics"]["phases"].items()}}


def show(row: dict[str, Any]) -> None:
    print(headline(row, WALL_TARGET_S, f"workers {row['workers_cpu_s']:.2f} CPU-s, ranks left "
                   f"the barrier within {row['step_end_spread_ms']:.2f} ms of each other"),
          flush=True)
    for p, m in row["phases"].items():
        print(f"    {p}: step p50 {m['step_p50_s'] * 1e3:.0f} ms p99 "
              f"{m['step_p99_s'] * 1e3:.0f} ms, idle {m['gpu_idle_fraction']:.2f}, "
              f"busbw {m['busbw_bps'] / 1e6:.1f} Mbit/s, {m['retransmits']} "
              f"retransmits, {m['ce_marked']} CE", flush=True)


def main() -> int:
    args = arguments(__doc__, SCENARIOS)
    resolution = time.get_clock_info("monotonic").resolution
    rows = each_run(args.scenarios, args.runs, measure, show)
    print(f"step clock: time.monotonic, resolution {resolution * 1e9:.0f} ns "
          f"({'ok' if resolution <= RESOLUTION_TARGET_S else 'MISSED'}; target 1 ms)")
    res = {"runs": rows, "clock_resolution_s": resolution,
           "wall_s_median": {n: statistics.median(r["wall_s"] for r in rows
                                                  if r["scenario"] == n)
                             for n in args.scenarios}}
    return finish(args.json, res, all(met(r, WALL_TARGET_S) for r in rows))


if __name__ == "__main__":
    sys.exit(main())
