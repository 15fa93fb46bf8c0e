"""Wall time of `fabriclab run streaming-incident` (six phases) and its BGP/failover times.

Usage: python bench/streaming_incident.py [--runs N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FABRICLAB = [sys.executable, "-m", "lab.cli"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            out = Path(tmp) / str(i)
            t0 = time.monotonic()
            subprocess.run([*FABRICLAB, "run", "streaming-incident", "--out", str(out)],
                           check=True, cwd=REPO, stdout=subprocess.DEVNULL)
            wall = time.monotonic() - t0
            r = json.loads((out / "result.json").read_text())
            ph = r["metrics"]["phases"]
            row = {"wall_s": wall, "routing_ready_s": r["timings"]["routing_ready_s"],
                   "incident_stalls": ph["incident"]["stalls"],
                   "fix_stalls": ph["fix-hash"]["stalls"] + ph["fix-placement"]["stalls"],
                   "withdrawn_s": [ph[p]["failover"]["withdrawn_after_s"]
                                   for p in ("failover-link", "failover-border")],
                   "cpu_idle_min_pct": r["fidelity"]["cpu_idle_min_pct"]}
            rows.append(row)
            print(f"streaming-incident: {wall:.1f} s wall, BGP multipath ready in "
                  f"{row['routing_ready_s']:.2f} s, incident stalls {row['incident_stalls']}, "
                  f"fix stalls {row['fix_stalls']}, route withdrawn after "
                  f"{row['withdrawn_s']} s, min CPU idle {row['cpu_idle_min_pct']:.0f}%",
                  flush=True)
    res = {"runs": rows, "wall_s_median": statistics.median(r["wall_s"] for r in rows)}
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
