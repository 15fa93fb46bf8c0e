"""Helpers for integration tests: run the real CLI as a user would; find leftovers."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from lab import state

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "lab.cli"]


#: The names the lab and its tests give switches, routers, hosts and their interfaces.
LAB_NODE = re.compile(r"(spine|leaf|core|agg|edge|psw)\d+")
LAB_INTF = re.compile(r"(spine|leaf|core|agg|edge|psw|h|r|src|dst|border|isp|cdn|anchor|"
                      r"viewer|dc|dccore)\d*-eth\d+")


def lab_leftovers() -> dict[str, list]:
    """Anything of FabricLab's that still exists on the machine."""
    intfs = [i for i in os.listdir("/sys/class/net") if LAB_INTF.fullmatch(i)]
    out = subprocess.run(["ovs-vsctl", "--timeout=5", "list-br"], capture_output=True,
                         text=True)
    bridges = [b for b in out.stdout.split() if LAB_NODE.fullmatch(b)]
    procs = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                env = (entry / "environ").read_bytes()
            except OSError:
                continue
            if f"{state.RUN_ENV}=".encode() in env and int(entry.name) != os.getpid():
                procs.append(int(entry.name))
    records = sorted(p.name for p in state.records_dir().glob("*.json")) \
        if state.records_dir().is_dir() else []
    return {"interfaces": intfs, "bridges": bridges, "processes": procs, "records": records}


def fabriclab(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(CLI + list(args), cwd=REPO, capture_output=True, text=True,
                       timeout=timeout)
    print(r.stdout)
    print(r.stderr, file=sys.stderr)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def run_scenario(tmp_path: Path, scenario: str, *args: str) -> dict:
    """`fabriclab run SCENARIO ARGS --out TMP` and its result.json."""
    out = tmp_path / "out"
    fabriclab("run", scenario, "--out", str(out), *args)
    return json.loads((out / "result.json").read_text())


def run_result(tmp_path: Path, *args: str) -> dict:
    """`fabriclab run ecmp-basic ARGS --out TMP` and its result.json."""
    return run_scenario(tmp_path, "ecmp-basic", *args)

#: Per-link agreement: a few per cent, plus a small absolute slack for the iperf3 control
#: connections (not watched) and the controller's packet-outs.
REL_TOL, ABS_TOL = 0.03, 64_000


def check_links_agree_with_flows(r: dict) -> list[str]:
    """Every fabric link's tx bytes = the bytes its flows' packets brought to the far switch."""
    switches = {s["name"] for s in r["topology"]["switches"]}
    carried: dict[tuple[str, str], int] = {}
    for f in r["flows"]:
        for path, hops in ((f["path"], f["hop_bytes"]),
                           (f["reverse_path"], f["reverse_hop_bytes"])):
            for a, b in itertools.pairwise(path):
                carried[(a, b)] = carried.get((a, b), 0) + hops[b]
    problems = []
    for ln in r["links"]:
        if ln["peer"] not in switches:
            continue
        flows_bytes = carried.get((ln["node"], ln["peer"]), 0)
        if abs(ln["tx_bytes"] - flows_bytes) > max(ABS_TOL, REL_TOL * ln["tx_bytes"]):
            problems.append(f"{ln['node']}->{ln['peer']}: link {ln['tx_bytes']} B, "
                            f"flows {flows_bytes} B")
    return problems


def spine_bytes_on_one_pair(policy: str, flows: list[tuple[int, int, int]],
                            sender_code: str, timeout: float) -> tuple[dict[int, dict], int]:
    """Run ``sender_code`` in h1 of ecmp-one-pair under ``policy``; read the spines' counters.

    ``flows`` are (cookie, sport, dport) of UDP flows h1 -> h3 to watch; ``sender_code`` is
    Python formatted with ``src`` and ``dst``. Returns {cookie: {spine: bytes}} and the
    controller's decisions during the sending.
    """
    from lab import run, telemetry
    (plan,) = run.make_plans("ecmp-one-pair", policy=policy, seed=1)
    hosts = {h["name"]: h["ip"] for h in plan.topo_desc["hosts"]}
    src, dst = hosts["h1"], hosts["h3"]
    with run.fabric_session(f"test-{plan.policy_label}", plan.topology(), plan.env, plan.runtime,
                            plan.policy, 1) as fabric:
        run.bring_up(plan, fabric, print)
        assert fabric.controller is not None
        fabric.controller.request({"cmd": "watch", "flows": [
            {"cookie": c, "proto": 17, "src": src, "dst": dst, "sport": sp, "dport": dp}
            for c, sp, dp in flows]})
        before = fabric.controller.request({"cmd": "status"})["decisions"]
        proc = fabric.host("h1").popen(["python3", "-c", sender_code.format(src=src, dst=dst)])
        fabric.record.add_pid(proc.pid, "test sender")
        assert proc.wait(timeout=timeout) == 0
        decisions = fabric.controller.request({"cmd": "status"})["decisions"] - before
        spines = [s["name"] for s in plan.topo_desc["switches"] if s["role"] == "spine"]
        counters = {sw: telemetry.flow_counters(sw) for sw in spines}
    return ({c: {sw: counters[sw].get(c, (0, 0))[1] for sw in spines} for c, _, _ in flows},
            decisions)
