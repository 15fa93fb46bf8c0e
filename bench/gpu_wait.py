"""Wall time of `fabriclab run gpu-wait`, each phase's least idle second (with and without
the loaders' idle-priority preprocessing counted as idle) and the causes the diagnosis named.

Usage: python bench/gpu_wait.py [--runs N] [--seeds 1 2] [--json FILE]

The fidelity line is 25 % idle (docs/fidelity.md); a phase whose loaders burn CPU on
purpose reports both numbers, so the adjustment is never hidden.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from clirun import finish, run_scenario


def measure(seed: int, wall: float, r: dict[str, Any]) -> dict[str, Any]:
    ph = r["metrics"]["phases"]
    return {"seed": seed, "wall_s": round(wall, 1),
            "least_idle_pct": {n: m["cpu_idle_min_pct"] for n, m in ph.items()},
            "least_idle_without_spare_pct": {
                n: (m.get("spare_work") or {}).get("cpu_idle_min_pct_without")
                for n, m in ph.items()},
            "gpu_idle_share": {n: m["gpu_wait"]["gpu_idle_share"] for n, m in ph.items()},
            "named": {n: d["named"] for n, d in r["diagnosis"]["gpu_wait"].items()},
            "fidelity_valid": r["fidelity"]["valid"]}


def show(row: dict[str, Any]) -> None:
    print(f"gpu-wait seed {row['seed']}: {row['wall_s']:.1f} s wall, least idle per phase "
          f"{row['least_idle_pct']} (without the loaders' {row['least_idle_without_spare_pct']}),"
          f" named {row['named']}, valid {row['fidelity_valid']}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--seeds", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for i in range(args.runs):
                out = Path(tmp) / f"{seed}-{i}"
                wall, r = run_scenario("gpu-wait", out, "--seed", str(seed))
                rows.append(measure(seed, wall, r))
                show(rows[-1])
    valid = all(r["fidelity_valid"] for r in rows)
    return finish(args.json, {"runs": rows,
                              "wall_s_median": statistics.median(r["wall_s"] for r in rows)},
                  valid)


if __name__ == "__main__":
    sys.exit(main())
