"""Wall time of `fabriclab run ecmp-basic` with a 10 s traffic phase, and single-flow goodput.

Usage: python bench/ecmp_basic.py [--json FILE]
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


def run(args: list[str], out: Path) -> tuple[float, dict]:
    t0 = time.monotonic()
    subprocess.run([*FABRICLAB, "run", "ecmp-basic", "--out", str(out), *args], check=True,
                   cwd=REPO, stdout=subprocess.DEVNULL)
    return time.monotonic() - t0, json.loads((out / "result.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for policy in ("hash5", "ovs-select", "hash-l3"):
            wall, r = run(["--policy", policy, "--duration", "10"], Path(tmp) / policy)
            res[f"wall_s_{policy}"] = wall
            print(f"ecmp-basic --policy {policy} --duration 10: {wall:.1f} s wall "
                  f"(bring-up {r['timings']['ready_s']:.1f} s, teardown "
                  f"{r['timings']['stop_s']:.1f} s), imbalance {r['metrics']['imbalance']:.2f}",
                  flush=True)
        # One flow on 100 Mbit/s links end to end, offered at the link rate.
        wall, r = run(["--policy", "hash5", "--duration", "10", "--set", "flows=1",
                       "--set", "host_bw=100", "--set", "load=0.5"], Path(tmp) / "single")
        goodput = r["flows"][0]["goodput_bps"]
        res["single_flow_goodput_mbps"] = goodput / 1e6
        print(f"single 100 Mbit/s flow: {goodput / 1e6:.1f} Mbit/s goodput, "
              f"{r['flows'][0]['retransmits']} retransmits", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
