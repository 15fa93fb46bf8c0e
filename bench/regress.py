"""`fabriclab regress` against its speed target: 3 scenarios x 5 trials <= 10 min.

Runs the default regression (ecmp-basic, ecmp-one-pair, allreduce-ecmp, seeds 1..5) for one
policy, writing a baseline, and reports the wall time, the time per trial and how many trials
had CPU to spare (fidelity valid).

Usage: python bench/regress.py [--policy P] [--trials N] [--json FILE]
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
WALL_TARGET_S = 600.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default="hash5")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--json", help="write the numbers here too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fabriclab-bench-") as tmp:
        base = Path(tmp) / "baseline.json"
        t0 = time.monotonic()
        cmd = [*FABRICLAB, "regress", "--policy", args.policy, "--trials", str(args.trials),
               "--baseline", str(base), "--update-baseline", "--out", str(Path(tmp) / "out")]
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall = time.monotonic() - t0
        if r.returncode != 0:
            print(r.stdout, r.stderr, file=sys.stderr)
            return 1
        results = [json.loads(p.read_text()) for p in (Path(tmp) / "out").rglob("result.json")]
        per_scenario: dict[str, list[float]] = {}
        for res in results:
            per_scenario.setdefault(res["scenario"], []).append(res["timings"]["wall_s"])
        valid = sum(res["fidelity"]["valid"] for res in results)
        baseline = json.loads(base.read_text())
    out = {"policy": args.policy, "trials": args.trials, "runs": len(results),
           "wall_s": round(wall, 1), "target_s": WALL_TARGET_S, "valid_runs": valid,
           "run_wall_s": {k: round(sum(v) / len(v), 1) for k, v in per_scenario.items()},
           "baseline_means": {sc: {k: m["mean"] for k, m in v["metrics"].items()}
                              for sc, v in baseline["scenarios"].items()}}
    print(f"regress {len(results)} runs ({args.policy}): {wall:.0f} s wall "
          f"(target <= {WALL_TARGET_S:.0f} s) {'OK' if wall <= WALL_TARGET_S else 'SLOW'}; "
          f"{valid}/{len(results)} runs fidelity-valid")
    for sc, w in out["run_wall_s"].items():
        print(f"  {sc:16s} {w:6.1f} s per run")
    for sc, means in out["baseline_means"].items():
        print(f"  {sc:16s} " + ", ".join(f"{k} {v:.3g}" for k, v in means.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0 if wall <= WALL_TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
