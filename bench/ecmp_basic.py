"""Wall time of `fabriclab run ecmp-basic` with a 10 s traffic phase, and single-flow goodput.

Usage: python bench/ecmp_basic.py [--json FILE]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from clirun import arguments, finish, run_scenario


def main() -> int:
    args = arguments(__doc__, runs=False)
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for policy in ("hash5", "ovs-select", "hash-l3"):
            wall, r = run_scenario("ecmp-basic", Path(tmp) / policy, "--policy", policy,
                                   "--duration", "10")
            res[f"wall_s_{policy}"] = wall
            print(f"ecmp-basic --policy {policy} --duration 10: {wall:.1f} s wall "
                  f"(bring-up {r['timings']['ready_s']:.1f} s, teardown "
                  f"{r['timings']['stop_s']:.1f} s), imbalance {r['metrics']['imbalance']:.2f}",
                  flush=True)
        # One flow on 100 Mbit/s links end to end, offered at the link rate.
        wall, r = run_scenario("ecmp-basic", Path(tmp) / "single", "--policy", "hash5",
                               "--duration", "10", "--set", "flows=1", "--set", "host_bw=100",
                               "--set", "load=0.5")
        goodput = r["flows"][0]["goodput_bps"]
        res["single_flow_goodput_mbps"] = goodput / 1e6
        print(f"single 100 Mbit/s flow: {goodput / 1e6:.1f} Mbit/s goodput, "
              f"{r['flows'][0]['retransmits']} retransmits", flush=True)
    return finish(args.json, res, True)


if __name__ == "__main__":
    sys.exit(main())
