"""The real collective library's scenarios against their speed target.

`allreduce-sweep` (64 KiB..16 MiB, synthetic ring and gloo on one fabric) and
`allreduce-gloo` (the model against the library, four phases): wall time of `fabriclab run`
with defaults (target <= 120 s on 2 cores, fidelity valid), the gloo ranks' CPU time, and
the numbers each run gives (the sweep's table; placed comm against the ideal).

Usage: python bench/allreduce_library.py [--runs N] [--scenarios A B ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FABRICLAB = [sys.executable, "-m", "lab.cli"]
SCENARIOS = ("allreduce-sweep", "allreduce-gloo")
WALL_TARGET_S = 120.0


def ranks_cpu_s(out: Path) -> float:
    """CPU seconds the ranks used, every phase (torch's import and rendezvous included)."""
    return sum(json.loads(p.read_text()).get("cpu_s", 0.0)
               for p in (out / "job").glob("*/rank*[0-9].json"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--scenarios", nargs="*", default=list(SCENARIOS))
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    missed = False
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.scenarios:
            for i in range(args.runs):
                out = Path(tmp) / f"{name}-{i}"
                t0 = time.monotonic()
                subprocess.run([*FABRICLAB, "run", name, "--out", str(out)], check=True,
                               cwd=REPO, stdout=subprocess.DEVNULL)
                wall = time.monotonic() - t0
                r = json.loads((out / "result.json").read_text())
                phases = r["metrics"]["phases"]
                row = {"scenario": name, "wall_s": round(wall, 1),
                       "cpu_idle_min_pct": r["fidelity"]["cpu_idle_min_pct"],
                       "fidelity_valid": r["fidelity"]["valid"],
                       "ranks_cpu_s": round(ranks_cpu_s(out), 1),
                       "phases": {p: {"comm_p50_s": m["comm_p50_s"],
                                      "ideal_comm_s": m["ideal_comm_s"],
                                      "busbw_bps": m["busbw_bps"],
                                      "sweep": m.get("sweep")} for p, m in phases.items()}}
                rows.append(row)
                ok = wall <= WALL_TARGET_S and row["fidelity_valid"]
                missed |= not ok
                fid = "valid" if row["fidelity_valid"] else "INVALID"
                print(f"{name}: {wall:.1f} s wall ({'ok' if ok else 'MISSED'}; target "
                      f"{WALL_TARGET_S:g} s, fidelity {fid}), min CPU idle "
                      f"{row['cpu_idle_min_pct']:.0f}%, ranks {row['ranks_cpu_s']:.1f} CPU-s",
                      flush=True)
                for p, m in row["phases"].items():
                    print(f"    {p}: comm p50 {m['comm_p50_s'] * 1e3:.0f} ms (ideal "
                          f"{m['ideal_comm_s'] * 1e3:.0f} ms), busbw "
                          f"{m['busbw_bps'] / 1e6:.1f} Mbit/s")
                    for s in m["sweep"] or []:
                        print(f"      {s['size_bytes']:>9} B  {s['time_s'] * 1e3:9.1f} ms  "
                              f"algbw {s['algbw_bps'] / 1e6:6.2f}  busbw "
                              f"{s['busbw_bps'] / 1e6:6.2f} Mbit/s  "
                              f"{s['busbw_vs_ideal']:.3f} of TCP's ceiling on the wire")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
