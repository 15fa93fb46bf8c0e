"""`fabriclab run ddp-train` against its speed target: a real DistributedDataParallel job
on gloo, six phases of four ranks (each phase's torch import, rendezvous and DDP set-up
included). Wall time (target <= 120 s on 2 cores, fidelity valid), the ranks' CPU time,
and per phase what DDP reported: forward, backward, all-reduce, overlap, step p50/p99,
GPU idle, busbw; with a data loader, the step's data wait share (over every rank, and of
each step's last rank to compute) and the causes the diagnosis named.

Usage: python bench/ddp_train.py [--runs N] [--json FILE]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from allreduce_library import WALL_TARGET_S, ranks_cpu_s
from clirun import arguments, base_row, each_run, finish, headline, met

SCENARIO = "ddp-train"
DDP_KEYS = ("fwd_p50_s", "bwd_p50_s", "comm_p50_s", "exposed_comm_p50_s", "overlap_fraction",
            "buckets")


def measure(name: str, out: Path, wall: float, r: dict[str, Any]) -> dict[str, Any]:
    row = {**base_row(name, wall, r), "ranks_cpu_s": round(ranks_cpu_s(out), 1), "phases": {}}
    for p, m in r["metrics"]["phases"].items():
        row["phases"][p] = {
            "step_p50_s": m["step_p50_s"], "step_p99_s": m["step_p99_s"],
            "gpu_idle_fraction": m["gpu_idle_fraction"], "busbw_bps": m["busbw_bps"],
            "ideal_comm_s": m["ideal_comm_s"],
            "collided_epochs": sum(e["collided"] for e in m["epochs"].values()),
            **{k: m["ddp"][k] for k in DDP_KEYS}}
        if m.get("gpu_wait"):
            row["phases"][p]["data_wait_share"] = m["gpu_wait"]["share"]["data_wait"]
            row["phases"][p]["critical_data_wait_share"] = \
                m["gpu_wait"]["critical_share"]["data_wait"]
            row["phases"][p]["named"] = r["diagnosis"]["gpu_wait"][p]["named"]
        if m.get("by_checkpoint"):
            row["phases"][p]["by_checkpoint_comm_p50_s"] = {
                k: v["comm_p50_s"] for k, v in m["by_checkpoint"].items()}
    return row


def show(row: dict[str, Any]) -> None:
    print(headline(row, WALL_TARGET_S, f"ranks {row['ranks_cpu_s']:.1f} CPU-s"), flush=True)
    for p, m in row["phases"].items():
        print(f"    {p}: step p50/p99 {m['step_p50_s'] * 1e3:.0f}/"
              f"{m['step_p99_s'] * 1e3:.0f} ms, fwd {m['fwd_p50_s'] * 1e3:.0f} bwd "
              f"{m['bwd_p50_s'] * 1e3:.0f} all-reduce {m['comm_p50_s'] * 1e3:.0f} ms "
              f"(ideal {m['ideal_comm_s'] * 1e3:.0f}), exposed "
              f"{m['exposed_comm_p50_s'] * 1e3:.0f} ms, {m['buckets']} buckets, "
              f"overlap {m['overlap_fraction'] * 100:.0f}%, GPU idle "
              f"{m['gpu_idle_fraction'] * 100:.0f}%, busbw "
              f"{m['busbw_bps'] / 1e6:.1f} Mbit/s, {m['collided_epochs']} epochs "
              "collided" + (f", checkpoint comm {m['by_checkpoint_comm_p50_s']}"
                            if "by_checkpoint_comm_p50_s" in m else "")
              + (f", data wait {m['data_wait_share'] * 100:.0f}% (last rank to compute "
                 f"{m['critical_data_wait_share'] * 100:.0f}%), named {m['named']}"
                 if "named" in m else ""))


def main() -> int:
    args = arguments(__doc__)
    rows = each_run([SCENARIO], args.runs, measure, show)
    return finish(args.json, rows, all(met(r, WALL_TARGET_S) for r in rows))


if __name__ == "__main__":
    sys.exit(main())
