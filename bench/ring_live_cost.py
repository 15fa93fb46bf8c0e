"""What ``--live-file`` costs a ring rank: the CPU seconds of two ranks (their own process,
the summary's ``cpu_s``, loader workers' apart) running the same steps on 127.0.0.1 with a
loader fed by a local storage server, without and with the live file, alternated.

    bench/ring_live_cost.py --steps 200 --runs 3

The numbers are the machine's of the moment: on 2 shared cores, repeat, and run it alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.unit.test_loader import Lab  # noqa: E402 - the repo's root first


def one(steps: int, live: bool) -> dict[str, float]:
    """One 2-rank job: its ranks' mean CPU seconds, wall time and live writes."""
    with tempfile.TemporaryDirectory(prefix="ring-live-cost-") as d:
        lab = Lab(Path(d))
        try:
            res = lab.results(lab.ring(steps, 2, 2, 2, live=live))
        finally:
            lab.kill_all()
    wall = max(s["t_end"] for r in res for s in r["steps"]) - min(
        s["t_start"] for r in res for s in r["steps"])
    return {"cpu_s": statistics.mean(r["cpu_s"] for r in res), "wall_s": round(wall, 3),
            "writes": statistics.mean(r["live_writes"] for r in res)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for live in [x for _ in range(a.runs) for x in (False, True)]:
        r = one(a.steps, live)
        print(json.dumps({"live_file": live, **r}), flush=True)
        results[live].append(r)
    for live, rows in results.items():
        cpu = [r["cpu_s"] for r in rows]
        per_s = [r["cpu_s"] / r["wall_s"] for r in rows]
        print(f"live_file={live!s:5} rank cpu_s median {statistics.median(cpu):.3f} "
              f"({100 * statistics.median(per_s):.2f} % of a core) over {len(cpu)} jobs of "
              f"{a.steps} steps; writes {[r['writes'] for r in rows]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
