"""lab.agents.worker run for real: ring ranks and incast over TCP in a private network namespace.

All traffic stays inside a namespace made for this module (``colltest-<pid>``): its loopback,
127.0.0.1..8 as distinct host addresses, shaped by a tbf qdisc to 400 Mbit/s so transfer times
are set by the "network", not by how busy the machine's 2 cores are. Every process is started
with ``nsenter`` (which execs, so the PID we hold is the worker's) and killed by PID afterwards.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
RATE_BPS = 400e6
TBF_BURST = 256 * 1024
WAIT_S = 20.0

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("nsenter") or not shutil.which("tc"),
    reason="needs root, nsenter and tc to make a private network namespace")

#: Listen and source ports: fresh ones per run, so no run meets the TIME_WAITs of the one before.
_ports = itertools.count(20000, 100)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture(scope="module")
def netns() -> Iterator[str]:
    name = f"colltest-{os.getpid()}"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        subprocess.run(["tc", "-n", name, "qdisc", "add", "dev", "lo", "root", "tbf", "rate",
                        f"{RATE_BPS:.0f}bit", "burst", str(TBF_BURST), "latency", "100ms"],
                       check=True, capture_output=True, timeout=10)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


class Launcher:
    """Starts workers inside the namespace; remembers every PID so teardown can kill it."""

    def __init__(self, ns: str, tmp: Path) -> None:
        self.ns, self.tmp = ns, tmp
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, *args: str) -> subprocess.Popen[str]:
        cmd = ["nsenter", f"--net=/run/netns/{self.ns}", sys.executable, "-m", "lab.agents.worker",
               *args]
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        self.procs.append(proc)
        return proc

    def finish(self, proc: subprocess.Popen[str]) -> tuple[int, str, str]:
        out, err = proc.communicate(timeout=WAIT_S)
        return proc.returncode, out, err

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()  # by PID
            proc.communicate()


@pytest.fixture
def launcher(netns: str, tmp_path: Path) -> Iterator[Launcher]:
    run = Launcher(netns, tmp_path)
    try:
        yield run
    finally:
        run.kill_all()


def ring_args(rank: int, world: int, base: int, out: Path, sports: int = 1,
              **opts: Any) -> list[str]:
    """Rank r listens on 127.0.0.(r+1):base and connects from ports base+10*r+1+epoch."""
    nxt = (rank + 1) % world
    args = ["ring", "--rank", str(rank), "--world", str(world),
            "--listen", f"127.0.0.{rank + 1}:{base}", "--next", f"127.0.0.{nxt + 1}:{base}",
            "--bind", f"127.0.0.{rank + 1}", "--out", str(out), "--connect-timeout-s", "10",
            "--io-timeout-s", "10"]
    if sports:
        args += ["--sports", ",".join(str(p) for p in rank_sports(base, rank, sports))]
    for key, value in opts.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def rank_sports(base: int, rank: int, count: int) -> list[int]:
    return [base + 10 * rank + 1 + e for e in range(count)]


def run_ring(launcher: Launcher, world: int, size: int, steps: int, sports: int = 1,
             **opts: Any) -> tuple[int, list[dict[str, Any]]]:
    """Run a whole ring to the end; return its listen port and every rank's JSON."""
    base = next(_ports)
    outs = [launcher.tmp / f"ring-{base}-{r}.json" for r in range(world)]
    procs = [launcher.start(*ring_args(r, world, base, outs[r], sports, size=size,
                                       steps=steps, **opts)) for r in range(world)]
    for proc in procs:
        code, _out, err = launcher.finish(proc)
        assert code == 0, err
    return base, [json.loads(p.read_text()) for p in outs]


def steady(rank: dict[str, Any], key: str) -> float:
    return statistics.median(s[key] for s in rank["steps"] if not s["warmup"])


# --------------------------------------------------------------------------------------------


def test_ring_four_ranks_steps_line_up_and_epochs_change_ports(launcher: Launcher) -> None:
    world, size, steps = 4, 4 << 20, 5
    t0 = time.monotonic()
    base, ranks = run_ring(launcher, world, size, steps, sports=3, compute_s=0.05,
                           epoch_steps=2, cc="cubic")
    wall = time.monotonic() - t0
    per_epoch = 2 * (world - 1) * size // world  # bytes a rank sends per step
    for r, rank in enumerate(ranks):
        assert rank["error"] is None
        assert (rank["mode"], rank["rank"], rank["world"]) == ("ring", r, world)
        assert (rank["size_bytes"], rank["buckets"], rank["cc"]) == (size, 1, "cubic")
        assert [s["step"] for s in rank["steps"]] == list(range(steps))
        assert [s["epoch"] for s in rank["steps"]] == [0, 0, 1, 1, 2]
        assert [s["warmup"] for s in rank["steps"]] == [True] + [False] * 4
        for s in rank["steps"]:
            assert s["comm_s"] > 0
            assert abs(s["step_s"] - (s["compute_s"] + s["comm_s"] + s["barrier_s"])) < 0.002
            assert s["idle_s"] == pytest.approx(s["step_s"] - s["compute_s"], abs=2e-6)
        conns = rank["connections"]
        assert [c["epoch"] for c in conns] == [0, 1, 2]
        assert [c["sport"] for c in conns] == rank_sports(base, r, 3)
        nxt = (r + 1) % world + 1
        for c, steps_in_epoch in zip(conns, (2, 2, 1), strict=True):
            assert (c["src"], c["dst"], c["dport"]) == (f"127.0.0.{r + 1}", f"127.0.0.{nxt}", base)
            assert isinstance(c["retransmits"], int)
            assert c["bytes_acked"] >= steps_in_epoch * per_epoch
        assert rank["cpu_s"] < 0.25 * wall, "a worker should sleep while the network works"
    for step in range(steps):
        # A barrier: no rank leaves it before every rank has entered it (comm done). What a
        # barrier guarantees, not how close together they leave: that is the scheduler's.
        entered = [rank["steps"][step]["t_comm_end"] for rank in ranks]
        left = [rank["steps"][step]["t_end"] for rank in ranks]
        assert min(left) >= max(entered) - 1e-6, f"step {step}: a rank left the barrier early"
    # The four flows share the 400 Mbit/s loopback, so the all-reduce cannot beat that rate.
    floor = world * per_epoch * 8 / RATE_BPS
    assert steady(ranks[0], "comm_s") > 0.8 * floor
    print(f"\n4 ranks x 4 MiB: comm {steady(ranks[0], 'comm_s') * 1e3:.0f} ms/step "
          f"(floor {floor * 1e3:.0f} ms), cpu {[r['cpu_s'] for r in ranks]} s in {wall:.1f} s")


def test_overlap_with_buckets_shortens_the_step(launcher: Launcher) -> None:
    # compute 0.12 s; comm of 1 MiB over 4 ranks sharing 400 Mbit/s is about 0.12 s too.
    opts = {"compute_s": 0.12, "cc": "cubic"}
    _, plain = run_ring(launcher, 4, 1 << 20, 3, buckets=1, **opts)
    _, overlapped = run_ring(launcher, 4, 1 << 20, 3, buckets=4, **opts)
    for a, b in zip(plain, overlapped, strict=True):
        assert b["buckets"] == 4
        assert steady(b, "step_s") < steady(a, "step_s") - 0.04
        assert all(s["t_comm_start"] < s["t_compute_end"] for s in b["steps"])
    print(f"\nbuckets=1 step {steady(plain[0], 'step_s') * 1e3:.0f} ms, "
          f"buckets=4 step {steady(overlapped[0], 'step_s') * 1e3:.0f} ms")


def test_straggler_slows_every_rank(launcher: Launcher) -> None:
    _, base = run_ring(launcher, 4, 64 << 10, 4, compute_s=0.05)
    _, slow = run_ring(launcher, 4, 64 << 10, 4, compute_s=0.05, straggler_rank=2,
                       straggler_s=0.1)
    for r, (a, b) in enumerate(zip(base, slow, strict=True)):
        assert steady(b, "step_s") - steady(a, "step_s") == pytest.approx(0.1, abs=0.03)
        if r != 2:
            assert steady(b, "idle_s") > 0.09  # waiting for rank 2 to finish computing


@pytest.mark.parametrize(("opts", "sports", "field"), [
    ({"size": 1001}, 1, "size_bytes"),               # not a multiple of world=4
    ({"size": 4096, "buckets": 3}, 1, "size_bytes"),  # not a multiple of world*buckets
    ({"size": 4096, "world": 1}, 1, "world"),
    ({"size": 4096}, 0, "sports"),                    # --sports missing
    ({"size": 4096, "epoch_steps": 2}, 2, "sports"),  # 5 steps need 3 epochs' ports
])
def test_bad_input_exits_2_with_one_line(launcher: Launcher, opts: dict[str, Any], sports: int,
                                         field: str) -> None:
    out = launcher.tmp / "bad.json"
    opts = dict(opts)
    world = opts.pop("world", 4)
    args = ring_args(0, 4, next(_ports), out, sports, steps=5, **opts)
    args[args.index("--world") + 1] = str(world)
    code, stdout, stderr = launcher.finish(launcher.start(*args))
    assert code == 2
    assert stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], stderr
    assert not out.exists()
    left = subprocess.run(["ip", "netns", "pids", launcher.ns], capture_output=True, text=True)
    assert left.stdout.split() == [], "a process was left behind in the namespace"


def test_sigterm_writes_json_and_peers_fail_cleanly(launcher: Launcher) -> None:
    base = next(_ports)
    outs = [launcher.tmp / f"term-{r}.json" for r in range(3)]
    procs = [launcher.start(*ring_args(r, 3, base, outs[r], size=9 << 16, steps=1000,
                                       buckets=3, compute_s=0.02)) for r in range(3)]
    time.sleep(1.5)  # started, connected and a few dozen steps in
    procs[1].send_signal(signal.SIGTERM)
    results = [launcher.finish(p) for p in procs]
    assert results[1][0] == 128 + signal.SIGTERM
    for (code, _out, err), out in zip(results, outs, strict=True):
        data = json.loads(out.read_text())
        assert data["error"], "an interrupted rank must say why"
        assert code != 0
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    stopped = json.loads(outs[1].read_text())
    assert stopped["error"] == "stopped by SIGTERM" and stopped["steps"], "steps so far kept"


def test_incast_sink_times_every_burst(launcher: Launcher) -> None:
    base, senders, burst, steps = next(_ports), 4, 256 << 10, 5
    sink_out = launcher.tmp / "sink.json"
    sink = launcher.start("incast-sink", "--listen", f"127.0.0.1:{base}", "--senders",
                          str(senders), "--burst", str(burst), "--steps", str(steps),
                          "--gap-s", "0.02", "--out", str(sink_out))
    outs = [launcher.tmp / f"send-{i}.json" for i in range(senders)]
    procs = [launcher.start("incast-send", "--connect", f"127.0.0.1:{base}", "--bind",
                            f"127.0.0.{i + 2}", "--sport", str(base + 1 + i), "--cc", "cubic",
                            "--out", str(outs[i])) for i in range(senders)]
    for proc in [sink, *procs]:
        code, _out, err = launcher.finish(proc)
        assert code == 0, err
    data = json.loads(sink_out.read_text())
    assert data["error"] is None and len(data["steps"]) == steps
    assert [a["sport"] for a in data["sender_addrs"]] == [base + 1 + i for i in range(senders)]
    # What tbf can let through in one step: its burst plus the rate.
    floor = (senders * burst - TBF_BURST) * 8 / RATE_BPS
    for s in data["steps"]:
        assert len(s["per_sender_s"]) == senders
        assert max(s["per_sender_s"]) == pytest.approx(s["step_s"], abs=2e-6)
        assert s["step_s"] >= floor
    for i, out in enumerate(outs):
        sent = json.loads(out.read_text())
        assert sent["error"] is None and len(sent["steps"]) == steps
        (conn,) = sent["connections"]
        assert (conn["sport"], conn["cc"]) == (base + 1 + i, "cubic")
        assert isinstance(conn["retransmits"], int)
        assert conn["bytes_acked"] >= steps * burst
    print(f"\nincast 4 x 256 KiB: steps {[s['step_s'] for s in data['steps']]} s "
          f"(floor {floor:.4f} s)")


def test_missing_peer_times_out_with_one_line(launcher: Launcher) -> None:
    out = launcher.tmp / "alone.json"
    args = ring_args(0, 2, next(_ports), out, size=4096, steps=1)
    args[args.index("--connect-timeout-s") + 1] = "0.5"
    code, _out, err = launcher.finish(launcher.start(*args))
    assert code == 1
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    data = json.loads(out.read_text())
    assert "cannot connect to next rank" in data["error"] and data["steps"] == []
