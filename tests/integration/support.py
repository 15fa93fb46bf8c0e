"""Helpers for integration tests: run the real CLI as a user would; find leftovers."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from lab.analysis import diagnose
from lab.machine import cpuclass, state
from lab.measure import headroom

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "lab.cli"]


#: The names the lab and its tests give switches, routers, hosts and their interfaces.
LAB_NODE = re.compile(r"(spine|leaf|core|agg|edge|psw|mgmt)\d+")
LAB_INTF = re.compile(r"(spine|leaf|core|agg|edge|psw|mgmt|h|r|src|dst|border|isp|cdn|anchor|"
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
    mech = cpuclass.mechanism()
    groups = sorted(str(g) for base in {mech.cpu, mech.acct} if base is not None
                    for g in base.glob("fabriclab-*"))
    return {"interfaces": intfs, "bridges": bridges, "processes": procs, "records": records,
            "cgroups": groups}


def fabriclab(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(CLI + list(args), cwd=REPO, capture_output=True, text=True,
                       timeout=timeout)
    print(r.stdout)
    print(r.stderr, file=sys.stderr)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def result_of(out: Path) -> dict:
    """The result.json a run wrote to ``out``."""
    return json.loads((out / "result.json").read_text())


#: Runs a test makes of a scenario whose run was CPU-bound before it fails: an invalid run
#: is a measurement that did not happen, so a test that needs a valid one runs it again, and
#: a machine too loaded for the lab fails the test with the numbers rather than hide.
VALID_TRIES = 3
#: Every re-run of this session, one line each (tests/conftest.py prints them at the end).
RERUNS: list[str] = []


def results_under(root: Path) -> list[dict]:
    """Every result.json under ``root`` (a regress's trials), in path order."""
    return [json.loads(p.read_text()) for p in sorted(root.rglob("result.json"))]


def cpu_bound(result: dict) -> list[str]:
    """The phases of a run whose CPU numbers fail the lab's own rule
    (``headroom.cpu_verdict``), one line each with the numbers; [] when none does. A run
    invalid for another reason (a flow's error, lost bytes) is not CPU-bound: it is what
    the test checks."""
    fid = result["fidelity"]
    out = []
    for name, ph in (fid.get("phases") or {"run": fid}).items():
        why = headroom.cpu_verdict(ph)
        if why is not None:
            out.append(f"{name}: {why}, datapath wait max {ph.get('datapath_wait_max_ms')} "
                       f"ms/s, softirq max {ph.get('softirq_max_pct')} %")
    for name, w in (fid.get("workers") or {}).items():
        if float(w["cpu_idle_min_pct"] or 0.0) < headroom.MIN_CPU_IDLE_PCT:
            out.append(f"worker {name}: least idle second {w['cpu_idle_min_pct']} %")
    return out


def valid_run(attempt: Callable[[int], dict], what: str, tries: int = VALID_TRIES,
              broken: Callable[[dict], list[str]] = cpu_bound) -> dict:
    """``attempt(n)``'s result, run again (n = 1, 2, ...) while the machine under it broke
    the measurement (``broken``: by default, it was CPU-bound), at most ``tries`` runs;
    each re-run printed and kept in ``RERUNS``. Fails with one line naming the phases and
    their numbers when no run was valid."""
    for n in range(tries):
        result = attempt(n)
        bound = broken(result)
        if not bound:
            return result
        label = "CPU-bound" if broken is cpu_bound else "broken by the machine"
        line = f"{what}: run {n + 1} of {tries} {label}: {'; '.join(bound)}"
        RERUNS.append(line)
        print(f"RE-RUN {line}", file=sys.__stderr__, flush=True)
    pytest.fail(f"{what}: no valid run in {tries}: {'; '.join(bound)}", pytrace=False)


#: On an uncongested fabric, the lab's ring's measured all-reduce time is within this of
#: 2(N-1)/N*S/B. Above the bound by the ring's per-hop latency and its ranks' waiting for a
#: CPU: quiet and valid, 1.05-1.08 on the 2-core machine one day, 1.11-1.21 another
#: (docs/fidelity.md). How close it comes is a speed target (bench/allreduce_library.py).
IDEAL_TOL = 0.25


def run_to(out: Path, scenario: str, *args: str, timeout: float = 300,
           need_valid: bool = True, tries: int = VALID_TRIES,
           broken: Callable[[dict], list[str]] = cpu_bound) -> dict:
    """`fabriclab run SCENARIO ARGS --out OUT` and its result.json (a module's one run).

    ``need_valid``: the test reads numbers that mean something only on a valid run, so a
    run the machine broke (``broken``: CPU-bound by default) is run again (``valid_run``,
    at most ``tries`` runs); each earlier attempt is kept beside ``out``
    (``OUT.cpu-bound-N``) to be looked at.
    """
    def attempt(n: int) -> dict:
        if n:
            out.rename(out.with_name(f"{out.name}.cpu-bound-{n}"))
        fabriclab("run", scenario, *args, "--out", str(out), timeout=timeout)
        return result_of(out)
    if not need_valid:
        return attempt(0)
    return valid_run(attempt, " ".join(["fabriclab run", scenario, *args]), tries, broken)


def run_scenario(tmp_path: Path, scenario: str, *args: str) -> dict:
    """`fabriclab run SCENARIO ARGS --out TMP` and its result.json."""
    return run_to(tmp_path / "out", scenario, *args)


def phase(r: dict, name: str) -> dict:
    """A phased run's metrics of phase ``name``."""
    return r["metrics"]["phases"][name]


#: What a run refused because another run holds the lab says.
BUSY = "another FabricLab run"

R = TypeVar("R")


def retry_while_busy(attempt: Callable[[], R], busy: Callable[[R], bool],
                     budget_s: float = 600.0, pause_s: float = 5.0) -> R:
    """``attempt()`` again while ``busy`` says another run held the lab, for ``budget_s``;
    the last attempt's outcome. For a run that cannot queue for the lock itself (one whose
    caller must see it start, such as --live)."""
    deadline = time.monotonic() + budget_s
    while True:
        outcome = attempt()
        if not busy(outcome) or time.monotonic() > deadline:
            return outcome
        time.sleep(pause_s)


def run_result(tmp_path: Path, *args: str) -> dict:
    """`fabriclab run ecmp-basic ARGS --out TMP` and its result.json."""
    return run_scenario(tmp_path, "ecmp-basic", *args)

def check_paths_follow_policy(r: dict, policy: str | type) -> None:
    """The controller installs exactly what a deciding policy chooses, so the path the
    counters show must be the one its choose() gives for the flow's 5-tuple at the first
    leaf, both ways: the data from leaf1, and the ACKs back from leaf2, a 5-tuple the policy
    decides on its own (ecmp-basic)."""
    from controllers import policies
    from controllers.policies.base import FlowKey
    pol = (policies.get(policy) if isinstance(policy, str) else policy)(seed=r["seed"])
    uplinks: dict[str, dict[int, str]] = {}
    for ln in r["topology"]["links"]:
        if ln["a"].startswith("leaf") and ln["b"].startswith("spine"):
            uplinks.setdefault(ln["a"], {})[ln["a_port"]] = ln["b"]
    for f in r["flows"]:
        forward = FlowKey(f["src_ip"], f["dst_ip"], 6, f["sport"], f["dport"])
        back = FlowKey(f["dst_ip"], f["src_ip"], 6, f["dport"], f["sport"])
        for path, key in ((f["path"], forward), (f["reverse_path"], back)):
            port_peer = uplinks[path[0]]
            assert path[1] == port_peer[pol.choose(key, path[0], sorted(port_peer))], (path, f)


def assert_nothing_left_behind() -> None:
    """With the lab lock held (no run in progress), nothing of the lab may exist."""
    with lab_turn():
        left = lab_leftovers()
    assert not any(left.values()), f"the lab left things behind: {left}"


#: Per-link agreement: a few per cent, plus a small absolute slack for the iperf3 control
#: connections (not watched) and the controller's packet-outs.
REL_TOL, ABS_TOL = 0.03, 64_000


def check_links_agree_with_flows(r: dict) -> list[str]:
    """Every fabric link's tx bytes = the bytes its flows' packets brought to the far switch
    (``diagnose.link_balance``'s "arrived", both directions of every flow; a flow seen on
    two paths is split between them by the switches' counts)."""
    switches = {s["name"] for s in r["topology"]["switches"]}
    balance = diagnose.link_balance(r)
    problems = []
    for ln in r["links"]:
        if ln["peer"] not in switches:
            continue
        flows_bytes = balance.get(f"{ln['node']}->{ln['peer']}", {}).get("arrived", 0)
        if abs(ln["tx_bytes"] - flows_bytes) > max(ABS_TOL, REL_TOL * ln["tx_bytes"]):
            problems.append(f"{ln['node']}->{ln['peer']}: link {ln['tx_bytes']} B, "
                            f"flows {flows_bytes} B")
    return problems


#: The most header bytes a frame of a TCP connection carries as a switch counts it (no
#: FCS): Ethernet 14, IPv4 20, TCP 20 with up to 20 of options (the SYN-ACK's; a data
#: segment carries 12, its timestamps).
FRAME_HEADER_MAX = 14 + 20 + 40
#: A ring connection's bytes on the port into its receiver, against its payload: counted
#: a wire frame at a time, headers (66 B on a 1448 B segment: 1.046), the ACKs of the
#: receiver's own connection (one per two segments: 1.023) and TCP's copies sent again,
#: which the ring's sender does not record: 1.15 leaves 8 % for them. Measured 1.024 in
#: every run of two fresh clones (8 runs; the userspace datapath with TSO counts 2.8 kB a
#: packet on average, so fewer headers), above 1.0 by the ACKs and headers it must show.
WIRE_OVERHEAD_MAX = 1.15


def server_sent(details: dict) -> dict[tuple[str, int], dict]:
    """The storage hosts' record of each batch connection, by its loader's (address, port)."""
    return {(c["peer"], c["port"]): c for s in details["gpu_wait"]["storage"].values()
            for c in s.get("batch_conns", [])}


def wire_bytes_max(conn: dict) -> int:
    """The most a batch connection's frames from its storage host can weigh on a switch
    port: what its TCP sent (each segment sent again counted again) plus a frame's headers
    per segment."""
    return conn["bytes_sent"] + conn["segs_out"] * FRAME_HEADER_MAX


def loader_bytes_problems(details: dict) -> list[str]:
    """A phase with data loaders (its ``phase_details``): what disagrees between the batches
    the ranks took and what crossed the fabric, as text (empty: all agree).

    Each loader connection is a flow with a path whose last switch delivered at least its
    worker's batches and at most what the storage host's TCP sent on it (its payload, each
    segment sent again counted again) plus a frame's headers per segment; and the storage
    hosts served exactly the bytes the ranks took."""
    problems = []
    sent = server_sent(details)
    flows = {(f["dst_ip"], f["dport"]): f for f in details["flows"] if f["kind"] == "loader"}
    ranks = details["gpu_wait"]["ranks"]
    if len(flows) != sum(rank["loader"]["workers"] for rank in ranks):
        problems.append(f"{len(flows)} loader flows for the ranks' workers")
    taken = 0
    for rank in ranks:
        if len(rank["loader"]["per_worker"]) != rank["loader"]["workers"]:
            problems.append(f"rank {rank['rank']}: {rank['loader']['per_worker']}")
        for w in rank["loader"]["per_worker"]:
            f = flows.get((w["src"], w["sport"]))
            if f is None or not w["bytes"] or not f["path"]:
                problems.append(f"rank {rank['rank']} worker {w['worker']}: no batch or "
                                f"no counted path ({f and f['path']})")
                continue
            delivered = f["hop_bytes"][f["path"][-1]]
            conn = sent.get((w["src"], w["sport"]))
            if conn is None:
                problems.append(f"{f['id']}: no record of it at its storage host")
                continue
            if not w["bytes"] <= delivered <= wire_bytes_max(conn):
                problems.append(f"{f['id']}: {delivered} B delivered for {w['bytes']} B "
                                f"of batches, the server sent {conn} ({f['hop_bytes']})")
            taken += w["bytes"]
    served = sum(s["batch_bytes"] for s in details["gpu_wait"]["storage"].values())
    if served != taken:
        problems.append(f"the storage hosts served {served} B, the ranks took {taken} B")
    return problems


def spine_bytes_on_one_pair(policy: str, flows: list[tuple[int, int, int]],
                            sender_code: str, timeout: float) -> tuple[dict[int, dict], int]:
    """Run ``sender_code`` in h1 of ecmp-one-pair under ``policy``; read the spines' counters.

    ``flows`` are (cookie, sport, dport) of UDP flows h1 -> h3 to watch; ``sender_code`` is
    Python formatted with ``src`` and ``dst``. Returns {cookie: {spine: bytes}} and the
    controller's decisions during the sending.
    """
    from lab import run
    from lab.kinds.base import bring_up
    from lab.measure import telemetry
    (plan,) = run.make_plans("ecmp-one-pair", policy=policy, seed=1)
    hosts = {h["name"]: h["ip"] for h in plan.topo_desc["hosts"]}
    src, dst = hosts["h1"], hosts["h3"]
    with run.fabric_session(f"test-{plan.policy_label}", plan.topology(), plan.env, plan.runtime,
                            plan.policy, 1) as fabric:
        bring_up(plan, fabric, print)
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
        counters = telemetry.flow_counters(spines)
    return ({c: {sw: counters[sw].get(c, (0, 0))[1] for sw in spines} for c, _, _ in flows},
            decisions)


def lab_turn_now() -> state.LabLock:
    """Block until the lab lock is ours (give it to ``release_lab_turn``).

    Other people's runs (CI, colleagues, benchmarks) may share this machine; while one of
    them holds the lock its switches and processes legitimately exist. Checks for
    leftovers therefore look only while holding the lock: then no run is in progress and
    anything of the lab that exists was left behind. Waiting forever blocks in the kernel
    (``LabLock.acquire``), which wakes us the instant the holder dies, before any polling
    waiter, so a test that kills a run gets the next turn itself.
    """
    lock = state.LabLock()
    lock.acquire(math.inf)
    return lock


def release_lab_turn(lock: state.LabLock) -> None:
    lock.release()


@contextlib.contextmanager
def lab_turn() -> Iterator[None]:
    """Hold the lab lock for the body (see ``lab_turn_now``)."""
    lock = lab_turn_now()
    try:
        yield
    finally:
        release_lab_turn(lock)


class LabTurnWaiter:
    """Wait for the lab lock in a thread, started while a run we will kill holds it.

    Started before ``kill -9``, it wins the lock the moment the killed run's lock is
    released, so no other waiting run can start on our leftovers before we clean them.
    """

    def __init__(self) -> None:
        self.lock: state.LabLock | None = None
        self._thread = threading.Thread(target=self._take, daemon=True)
        self._thread.start()

    def _take(self) -> None:
        self.lock = lab_turn_now()

    def __enter__(self) -> LabTurnWaiter:
        return self

    def wait(self, timeout: float = 60.0) -> None:
        self._thread.join(timeout)
        assert self.lock is not None, f"the lab lock was not free within {timeout:g} s"

    def __exit__(self, *exc: object) -> None:
        self._thread.join(5.0)
        if self.lock is not None:
            release_lab_turn(self.lock)
            self.lock = None


class RunWatcher:
    """`fabriclab run ...` in the background, its output read by a thread, line by line.

    A thread (not readline in the test) so a kill can come at any time and what the run
    printed before it is still there; each line is kept with when it arrived.
    """

    def __init__(self, *args: str, env: dict[str, str] | None = None,
                 prefix: list[str] | None = None) -> None:
        self.proc = subprocess.Popen([*(prefix or []), *CLI, "run", *args], cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env)
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append((time.monotonic(), line))
                self._cond.notify_all()
        with self._cond:
            self.lines.append((time.monotonic(), ""))      # EOF marker
            self._cond.notify_all()

    def output(self) -> str:
        with self._cond:
            return "".join(text for _, text in self.lines)

    def saw(self, needle: str) -> bool:
        return needle in self.output()

    def wait_for(self, needle: str, timeout: float = 120.0) -> float:
        """When the first line containing ``needle`` arrived (monotonic)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for t, text in self.lines:
                    if needle in text:
                        return t
                if self.lines and self.lines[-1][1] == "":
                    raise AssertionError(f"run ended without {needle!r}:\n{self.output()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {needle!r} in {timeout:g} s:\n{self.output()}")
                self._cond.wait(left)

    def finish(self, timeout: float = 120.0) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(10.0)
        return rc


def record_of(owner_pid: int) -> state.RunRecord | None:
    """The run record written by the process ``owner_pid`` (a `fabriclab run` we started)."""
    if not state.records_dir().is_dir():
        return None
    for path in state.records_dir().glob("*.json"):
        try:
            rec = state.RunRecord.load(path)
        except (OSError, ValueError, TypeError):
            continue              # being replaced right now, or someone else's in progress
        if rec.owner_pid == owner_pid:
            return rec
    return None


def pids_started(owner_pid: int, what: Callable[[str], bool], timeout: float = 60.0) -> list[dict]:
    """The PIDs the run of ``owner_pid`` recorded whose description ``what`` accepts, once
    there are any (at most ``timeout`` s; empty if none came)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = record_of(owner_pid)
        found = [p for p in rec.pids if what(str(p["what"]))] if rec is not None else []
        if found:
            return found
        time.sleep(0.2)
    return []


def kill_9_mid_run(args: list[str], what: Callable[[str], bool],
                   settle_s: float = 0.0,
                   until: Callable[[str], bool] | None = None) -> list[dict]:
    """Start `fabriclab run ARGS`; once it has recorded PIDs that ``until`` (default:
    ``what``) accepts, and ``settle_s`` later, ``kill -9`` it and run `fabriclab clean`. Then
    none of the PIDs ``what`` accepts lives and nothing of the lab is left; returns those
    PIDs for further checks."""
    proc = subprocess.Popen([*CLI, "run", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    started = pids_started(proc.pid, until or what)
    assert started, "what was to be killed never started"
    time.sleep(settle_s)
    if until is not None:
        rec = record_of(proc.pid)
        started = [p for p in (rec.pids if rec else []) if what(str(p["what"]))]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    fabriclab("clean")
    alive = [p for p in started if state.pid_alive(int(p["pid"]), p["start"])]
    assert not alive, alive
    left = lab_leftovers()
    assert not any(left.values()), left
    return started
