"""The real collective library's scenarios against their speed target.

`allreduce-sweep` (64 KiB..16 MiB, synthetic ring and gloo on one fabric) and
`allreduce-gloo` (the model against the library, four phases): wall time of `fabriclab run`
with defaults (target <= 120 s on 2 cores, fidelity valid), the gloo ranks' CPU time, and
the numbers each run gives (the sweep's table; placed comm against the ideal).

Usage: python bench/allreduce_library.py [--runs N] [--scenarios A B ...] [--json FILE]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from clirun import arguments, base_row, each_run, finish, headline, met

SCENARIOS = ("allreduce-sweep", "allreduce-gloo")
WALL_TARGET_S = 120.0


def ranks_cpu_s(out: Path) -> float:
    """CPU seconds the ranks used, every phase (torch's import and rendezvous included)."""
    return sum(json.loads(p.read_text()).get("cpu_s", 0.0)
               for p in (out / "job").glob("*/rank*[0-9].json"))


def measure(name: str, out: Path, wall: float, r: dict[str, Any]) -> dict[str, Any]:
    return {**base_row(name, wall, r), "ranks_cpu_s": round(ranks_cpu_s(out), 1),
            "phases": {p: {"comm_p50_s": m["comm_p50_s"], "ideal_comm_s": m["ideal_comm_s"],
                           "busbw_bps": m["busbw_bps"], "sweep": m.get("sweep")}
                       for p, m in r["metrics"]["phases"].items()}}


def show(row: dict[str, Any]) -> None:
    print(headline(row, WALL_TARGET_S, f"ranks {row['ranks_cpu_s']:.1f} CPU-s"), flush=True)
    for p, m in row["phases"].items():
        print(f"    {p}: comm p50 {m['comm_p50_s'] * 1e3:.0f} ms (ideal "
              f"{m['ideal_comm_s'] * 1e3:.0f} ms), busbw {m['busbw_bps'] / 1e6:.1f} Mbit/s")
        for s in m["sweep"] or []:
            print(f"      {s['size_bytes']:>9} B  {s['time_s'] * 1e3:9.1f} ms  "
                  f"algbw {s['algbw_bps'] / 1e6:6.2f}  busbw {s['busbw_bps'] / 1e6:6.2f} "
                  f"Mbit/s  {s['busbw_vs_ideal']:.3f} of TCP's ceiling on the wire")


def main() -> int:
    args = arguments(__doc__, SCENARIOS)
    rows = each_run(args.scenarios, args.runs, measure, show)
    return finish(args.json, rows, all(met(r, WALL_TARGET_S) for r in rows))


if __name__ == "__main__":
    sys.exit(main())
