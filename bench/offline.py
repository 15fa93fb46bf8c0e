"""Offline policy evaluation speed: decisions per second of every policy.

For each registered policy: ``lab.analysis.offline.throughput`` (its ``choose``, plus
``placed`` for a policy that keeps state, on synthetic 5-tuples; median of ``--runs``), and
the whole evaluator around it (``bucket_eval``: 8 flows per set on 2 ports, a fresh policy per set),
both in flows/s. Target: >= 100k flows/s for the hash policies on 2 cores, so that the
thousands of sets that make a collision probability take well under a second. Stateful
policies are measured too but have no target: they trade speed for what they remember.

Usage: python bench/offline.py [--n N] [--runs R] [--policies A B ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

from controllers import policies
from lab.analysis import offline

TARGET_FLOWS_S = 100_000.0
#: The policies the target is for: the pure hashes, whose decision is one CRC.
HASH_POLICIES = ("hash5", "hash5-tier", "hash-l3", "ovs-select")


def eval_rate(name: str, n: int) -> float:
    """Flows/s through ``bucket_eval`` (sets of 8 on 2 ports), generation excluded."""
    ips = [f"10.0.0.{i}" for i in range(1, 17)]
    flows = offline.synthetic_flows(n, random.Random(1), ips, ips)
    t0 = time.perf_counter()
    offline.bucket_eval(policies.get(name), flows, "leaf1", [3, 4], 8, seed=1)
    return n / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000, help="flows per throughput run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--policies", nargs="*", default=policies.available())
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for name in args.policies:
        cls = policies.get(name)
        rates = [offline.throughput(cls, args.n, seed=run) for run in range(args.runs)]
        choose_rate = statistics.median(rates)
        full_rate = eval_rate(name, min(args.n, 40_000))
        target = name in HASH_POLICIES
        verdict = ("ok" if choose_rate >= TARGET_FLOWS_S else "MISSED") if target else "-"
        rows.append({"policy": name, "granularity": cls.granularity,
                     "choose_flows_s": round(choose_rate), "eval_flows_s": round(full_rate),
                     "target_flows_s": TARGET_FLOWS_S if target else None,
                     "verdict": verdict, "runs": [round(r) for r in rates]})
    width = max(len(r["policy"]) for r in rows)
    print(f"{'policy':<{width}}  {'granularity':<11}  {'choose flows/s':>14}  "
          f"{'bucket_eval flows/s':>19}  target {TARGET_FLOWS_S / 1e3:g}k")
    for r in rows:
        print(f"{r['policy']:<{width}}  {r['granularity']:<11}  {r['choose_flows_s']:>14,}  "
              f"{r['eval_flows_s']:>19,}  {r['verdict']}", flush=True)
    print(f"({args.n} flows per run, median of {args.runs}; {os.cpu_count()} CPUs; "
          f"Python {sys.version.split()[0]})")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "n": args.n, "runs": args.runs,
                                               "cpus": os.cpu_count()}, indent=1))
    return 0 if all(r["verdict"] != "MISSED" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
