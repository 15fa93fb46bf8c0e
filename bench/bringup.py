"""Bring-up and teardown times: the lab beside bare Mininet, same topology, same switch type.

"All hosts reachable" means a full pingall with 0% loss. Bare Mininet uses the same OVS
switch class and datapath, TCLink at the same rates, and the same controller process, so the
difference is what the lab adds (name checks, records, shaped queues, readiness wait).

Usage: python bench/bringup.py [--repeat N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

from mininet.link import TCLink
from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.node import OVSSwitch

from controllers.config import build as controller_config
from lab import run
from lab.machine import environment, state
from lab.net.controller import Controller
from lab.net.fabric import LabControllerRef, planned_names
from lab.net.reach import ping_all
from lab.net.topologies import describe, make_topology

CASES = {
    "leafspine 2x4, 8 hosts": {"type": "leafspine", "spines": 2, "leaves": 4,
                               "hosts_per_leaf": 2},
    "fat-tree k=4, 16 hosts": {"type": "fattree", "k": 4},
    "fat-tree k=8, 128 hosts": {"type": "fattree", "k": 8},
}


def reach_all(net: Mininet, timeout_s: float = 30.0) -> None:
    """The same all-pairs check for both sides (the lab's parallel pingall)."""
    deadline = time.monotonic() + timeout_s
    while ping_all(net.hosts) > 0:
        if time.monotonic() > deadline:
            raise RuntimeError("hosts not reachable")


def lab_once(spec: dict, env: environment.Environment, runtime: str) -> dict[str, float]:
    topo = make_topology(spec)
    t0 = time.monotonic()
    with run.fabric_session("bench", topo, env, runtime, "ovs-select", 1) as fabric:
        fabric.start()
        assert fabric.net is not None
        reach_all(fabric.net)
        up = time.monotonic() - t0
        t1 = time.monotonic()
    down = time.monotonic() - t1
    return {"up_s": up, "down_s": down}


def bare_once(spec: dict, env: environment.Environment, runtime: str) -> dict[str, float]:
    """Bare Mininet with the same switches and the same controller (its start is timed too)."""
    topo = make_topology(spec)
    lock = state.LabLock()
    lock.acquire()
    record = state.RunRecord.new(f"bench-bare-{int(time.time() * 1000)}")
    work = state.STATE_DIR / "work" / record.run_id
    work.mkdir(parents=True, exist_ok=True)
    record.paths.append(str(work))
    record.bridges, record.interfaces = planned_names(topo)
    record.save()
    t0 = time.monotonic()
    ctrl = Controller(runtime, controller_config(describe(topo), "ovs-select", 1), work, record)
    ctrl.start()
    try:
        net = Mininet(topo=topo, switch=partial(OVSSwitch, datapath=env.datapath,
                                                protocols="OpenFlow13"),
                      link=TCLink, controller=partial(LabControllerRef, ip="127.0.0.1",
                                                      port=ctrl.port),
                      autoStaticArp=True, waitConnected=False)
        net.start()
        reach_all(net)
        up = time.monotonic() - t0
        t1 = time.monotonic()
        net.stop()
        down = time.monotonic() - t1
    finally:
        ctrl.stop()
        state.remove(record)
        lock.release()
    return {"up_s": up, "down_s": down}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    setLogLevel("warning")
    env = environment.detect()
    runtime = environment.pick_runtime(env.runtimes, None)
    out = {}
    for name, spec in CASES.items():
        lab = [lab_once(spec, env, runtime) for _ in range(args.repeat)]
        bare = [bare_once(spec, env, runtime) for _ in range(args.repeat)]
        row = {
            "lab_up_s": statistics.median(r["up_s"] for r in lab),
            "lab_down_s": statistics.median(r["down_s"] for r in lab),
            "bare_up_s": statistics.median(r["up_s"] for r in bare),
            "bare_down_s": statistics.median(r["down_s"] for r in bare),
        }
        row["ratio_up"] = row["lab_up_s"] / row["bare_up_s"]
        out[name] = row
        print(f"{name:24s} lab up {row['lab_up_s']:.2f} s, down {row['lab_down_s']:.2f} s | "
              f"bare Mininet up {row['bare_up_s']:.2f} s, down {row['bare_down_s']:.2f} s | "
              f"lab/bare {row['ratio_up']:.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
