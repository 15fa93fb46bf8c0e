"""Wall time of `fabriclab run streaming-incident` (six phases) and its BGP/failover times.

Usage: python bench/streaming_incident.py [--runs N] [--json FILE]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

from clirun import arguments, each_run, finish


def measure(_name: str, _out: Path, wall: float, r: dict[str, Any]) -> dict[str, Any]:
    ph = r["metrics"]["phases"]
    return {"wall_s": wall, "routing_ready_s": r["timings"]["routing_ready_s"],
            "incident_stalls": ph["incident"]["stalls"],
            "fix_stalls": ph["fix-hash"]["stalls"] + ph["fix-placement"]["stalls"],
            "withdrawn_s": [ph[p]["failover"]["withdrawn_after_s"]
                            for p in ("failover-link", "failover-border")],
            "cpu_idle_min_pct": r["fidelity"]["cpu_idle_min_pct"]}


def show(row: dict[str, Any]) -> None:
    print(f"streaming-incident: {row['wall_s']:.1f} s wall, BGP multipath ready in "
          f"{row['routing_ready_s']:.2f} s, incident stalls {row['incident_stalls']}, "
          f"fix stalls {row['fix_stalls']}, route withdrawn after "
          f"{row['withdrawn_s']} s, min CPU idle {row['cpu_idle_min_pct']:.0f}%", flush=True)


def main() -> int:
    args = arguments(__doc__)
    rows = each_run(["streaming-incident"], args.runs, measure, show)
    return finish(args.json, {"runs": rows,
                              "wall_s_median": statistics.median(r["wall_s"] for r in rows)},
                  True)


if __name__ == "__main__":
    sys.exit(main())
