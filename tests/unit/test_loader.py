"""The ring rank's input pipeline (lab.agents.loader), run for real on 127.0.0.1.

Two ranks of ``python -m lab.agents.worker ring`` and a ``python -m lab.agents.storage serve``
run as processes on free loopback ports; the loader's workers are real forked processes that
fetch their batches over real TCP and burn real CPU. Every process is stopped by PID.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.agents import worker
from lab.agents.common import proc_stat

REPO = Path(__file__).resolve().parents[2]
#: Bounds a hang, not the speed: a busy CI machine starts Python slowly.
WAIT_S = 30.0
COMPUTE_S = 0.02


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on now: the kernel's pick for sockets held open together."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Lab:
    """Starts the storage server and ranks, remembers every PID so that teardown kills it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[str]] = []
        self.storage_port = free_ports(1)[0]
        self.server = self._start("lab.agents.storage", "serve", "--listen",
                                  f"127.0.0.1:{self.storage_port}", "--out",
                                  str(tmp / "storage.json"))
        deadline = time.monotonic() + WAIT_S
        while True:  # up once it accepts; the probe shows in its count of connections
            try:
                socket.create_connection(("127.0.0.1", self.storage_port), 1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "storage server did not come up"
                time.sleep(0.05)

    def _start(self, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-m", *args], cwd=REPO, text=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.procs.append(proc)
        return proc

    def ring(self, steps: int, workers: int, prefetch: int, cpu_ms: float,
             *extra: str, live: bool = False) -> list[subprocess.Popen[str]]:
        """Start a 2-rank ring whose ranks each have ``workers`` loader workers (with
        ``live``, each a live file: ``rank<r>.live.json``)."""
        listen = free_ports(2)
        sports = free_ports(2 + 2 * workers)
        ranks = []
        for r in range(2):
            mine = sports[2 + r * workers:2 + (r + 1) * workers]
            ranks.append(self._start(
                "lab.agents.worker", "ring", "--rank", str(r), "--world", "2",
                "--listen", f"127.0.0.1:{listen[r]}", "--next", f"127.0.0.1:{listen[1 - r]}",
                "--bind", "127.0.0.1", "--sports", str(sports[r]), "--size", "65536",
                "--steps", str(steps), "--warmup", "2", "--compute-s", str(COMPUTE_S),
                "--storage", f"127.0.0.1:{self.storage_port}",
                "--loader-workers", str(workers), "--loader-sports", ",".join(map(str, mine)),
                "--prefetch", str(prefetch), "--batch-bytes", "65536", "--cpu-ms", str(cpu_ms),
                "--out", str(self.tmp / f"rank{r}.json"), *extra,
                *(["--live-file", str(self.tmp / f"rank{r}.live.json")] if live else [])))
        return ranks

    def results(self, ranks: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
        """Wait for the ranks; their JSON, after checking each ended well."""
        out = []
        for r, proc in enumerate(ranks):
            _, err = proc.communicate(timeout=WAIT_S)
            assert proc.returncode == 0, err
            out.append(json.loads((self.tmp / f"rank{r}.json").read_text()))
        return out

    def stop_server(self) -> dict[str, int]:
        """Stop the storage server by PID; what it says it served."""
        self.server.terminate()
        self.server.communicate(timeout=WAIT_S)
        return json.loads((self.tmp / "storage.json").read_text())

    def kill_all(self) -> None:
        """Whatever still runs, killed by PID (``Popen.kill`` leaves a reaped one alone)."""
        for proc in self.procs:
            proc.kill()
            proc.communicate()


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    bench = Lab(tmp_path)
    try:
        yield bench
    finally:
        bench.kill_all()


def measured(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in result["steps"] if not s["warmup"]]


def assert_parts_are_in_order(result: dict[str, Any]) -> None:
    """Each step's parts as the stamps of two processes order them (the parts' sum is the
    step by construction, so it is not checked: it could not fail)."""
    for s in result["steps"]:
        assert s["exposed_comm_s"] >= 0, s  # the all-reduce cannot end before compute does
        if result["buckets"] == 1:  # no overlap: all of the all-reduce is exposed
            assert s["exposed_comm_s"] == pytest.approx(s["comm_s"], abs=2e-6), s
        # The batch was made before the rank had it; one not ready at the ask was made
        # during the wait, so the wait is the loader's.
        assert s["batch"]["t_ready"] <= s["t_batch"] + 1e-6, s
        if not s["batch"]["ready"]:
            assert s["batch"]["t_ready"] >= s["t_start"], s


def test_an_ample_loader_leaves_no_data_wait(lab: Lab) -> None:
    results = lab.results(lab.ring(12, workers=4, prefetch=2, cpu_ms=2))
    served = lab.stop_server()
    for res in results:
        steps = measured(res)
        # Batches wait for the rank, not the rank for them (a median: a busy machine may
        # hold up a rank once in a while, wherever it is).
        assert statistics.median(s["data_wait_s"] for s in steps) < 0.001, steps
        assert sum(s["batch"]["ready"] for s in steps) >= len(steps) - 1, steps
        loader = res["loader"]
        assert [w["batches"] for w in loader["per_worker"]] == [3, 3, 3, 3]
        assert all(w["exit"] == 0 for w in loader["per_worker"])
        assert sum(w["bytes_received"] for w in loader["per_worker"]) == 12 * 65536
        assert_parts_are_in_order(res)
    assert served["batches"] == 24 and served["batch_bytes"] == 24 * 65536
    # The server's own record of each batch connection, by its loader's address: what its
    # TCP sent there is at least what that loader received (and counted every segment).
    conns = {(c["peer"], c["port"]): c for c in served["batch_conns"]}
    workers = [w for res in results for w in res["loader"]["per_worker"]]
    assert len(conns) == len(workers) == 8
    for w in workers:
        c = conns[(w["src"], w["sport"])]
        assert c["bytes_sent"] >= w["bytes_received"] == 3 * 65536, (c, w)
        assert c["segs_out"] >= c["bytes_sent"] / c["snd_mss"], c


def test_a_cpu_bound_loader_makes_the_data_wait_dominate(lab: Lab) -> None:
    cpu_ms = 100.0
    results = lab.results(lab.ring(8, workers=1, prefetch=1, cpu_ms=cpu_ms))
    # The job waits for data far longer than it computes. Summed over both ranks: a rank
    # whose worker got ahead sees the other's data wait through the ring, in comm.
    every = [s for res in results for s in measured(res)]
    assert sum(s["data_wait_s"] for s in every) > 2 * sum(s["compute_s"] for s in every)
    # On (nearly) every step some rank asked before its batch was made: the job's pace is
    # the slower worker's (the other worker, a little ahead, has its batch ready).
    paired = list(zip(*(measured(res) for res in results), strict=True))
    starved = sum(any(not s["batch"]["ready"] and s["batch"]["queue_depth"] == 0 for s in step)
                  for step in paired)
    assert starved >= len(paired) - 1, paired
    for res in results:
        steps = measured(res)
        # One worker makes one batch at a time, so a rank that really waits for its batch
        # cannot step faster than a batch's burn.
        assert statistics.median(s["step_s"] for s in steps) >= cpu_ms / 1000, steps
        (w,) = res["loader"]["per_worker"]
        assert w["batches"] == 8
        # Each batch burnt its CPU, measured by the worker, and the kernel agrees in total.
        for s in res["steps"]:
            assert cpu_ms / 1000 <= s["batch"]["prep_cpu_s"] < cpu_ms / 1000 + 0.005, s
            assert s["batch"]["prep_wall_s"] >= s["batch"]["prep_cpu_s"] - 0.001, s
        assert 8 * cpu_ms / 1000 <= w["cpu_s"] < 8 * cpu_ms / 1000 * 1.1 + 0.03, w
        assert_parts_are_in_order(res)


def test_parts_add_up_with_overlapped_buckets(lab: Lab) -> None:
    results = lab.results(lab.ring(8, 2, 2, 5, "--buckets", "4"))
    for res in results:
        assert res["buckets"] == 4
        assert_parts_are_in_order(res)
        assert any(s["comm_s"] > s["exposed_comm_s"] for s in res["steps"])  # overlap seen


BAD = [
    (["--loader-workers", "2", "--loader-sports", "7001"], "loader_sports"),
    (["--loader-sports", "7001", "--prefetch", "0"], "prefetch"),
    (["--loader-workers", "0", "--loader-sports", "7001"], "loader_workers"),
    (["--loader-sports", "7001,7001", "--loader-workers", "2"], "loader_sports"),
    (["--loader-sports", "6001"], "loader_sports"),  # the ring's own source port
    (["--loader-sports", "7001", "--cpu-ms", "-1"], "cpu_ms"),
]


@pytest.mark.parametrize(("flags", "name"), BAD)
def test_bad_loader_input_exits_2_naming_the_option(flags: list[str], name: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    storage = socket.socket()
    storage.bind(("127.0.0.1", 0))
    storage.listen(4)
    storage.setblocking(False)
    with storage:
        port = storage.getsockname()[1]
        code = worker.main(["ring", "--rank", "0", "--world", "2", "--listen", "127.0.0.1:6101",
                            "--next", "127.0.0.1:6102", "--bind", "127.0.0.1", "--sports",
                            "6001", "--size", "1024", "--steps", "2", "--storage",
                            f"127.0.0.1:{port}", *flags])
        err = capsys.readouterr().err
        assert code == 2
        assert err.count("\n") == 1 and f"error: {name}:" in err, err
        with pytest.raises(BlockingIOError):  # nothing started: no worker connected
            storage.accept()


def test_a_malformed_storage_address_is_a_usage_error(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    with pytest.raises(SystemExit) as exc:
        worker.main(["ring", "--rank", "0", "--world", "2", "--listen", "127.0.0.1:6101",
                     "--next", "127.0.0.1:6102", "--bind", "127.0.0.1", "--sports", "6001",
                     "--size", "1024", "--steps", "2", "--storage", "storage-host"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "--storage" in err, err


def children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid``."""
    kids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := proc_stat(int(entry))) and fields[1] == str(pid):
            kids.add(int(entry))
    return kids


def alive(pid: int) -> bool:
    """Running or not yet reaped by anyone: a zombie still holds its PID."""
    return proc_stat(pid) is not None


def running_workers(rank: subprocess.Popen[str], count: int) -> set[int]:
    """Wait until the rank has forked its loader workers; their PIDs."""
    deadline = time.monotonic() + WAIT_S
    while len(kids := children(rank.pid)) < count:
        assert rank.poll() is None and time.monotonic() < deadline, "no loader workers"
        time.sleep(0.02)
    return kids


def gone(pids: set[int], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_sigterm_of_the_rank_leaves_no_loader_process(lab: Lab) -> None:
    ranks = lab.ring(10_000, 2, 2, 5)
    pids = [running_workers(rank, 2) for rank in ranks]
    time.sleep(0.3)  # into the steps
    ranks[0].terminate()
    _, err = ranks[0].communicate(timeout=WAIT_S)
    assert ranks[0].returncode == 128 + signal.SIGTERM, err
    assert gone(pids[0], timeout_s=0.5)  # stopped and reaped before the rank exited
    res = json.loads((lab.tmp / "rank0.json").read_text())
    assert {w["pid"] for w in res["loader"]["per_worker"]} == pids[0]
    assert res["error"] == "stopped by SIGTERM" and res["steps"]
    ranks[1].communicate(timeout=WAIT_S)  # its previous rank vanished: it ends by itself
    assert ranks[1].returncode == 1
    assert gone(pids[1])


def test_loader_workers_preprocess_at_idle_priority(lab: Lab) -> None:
    """A worker's burn takes only CPU nobody else wants (the lab counts it as idle when it
    judges fidelity); the rank itself keeps the normal policy."""
    ranks = lab.ring(10_000, 2, 2, 5)
    for rank in ranks:
        pids = running_workers(rank, 2)
        deadline = time.monotonic() + WAIT_S  # the child sets it right after the fork
        while any(os.sched_getscheduler(p) != os.SCHED_IDLE for p in pids):
            assert time.monotonic() < deadline, [os.sched_getscheduler(p) for p in pids]
            time.sleep(0.02)
        assert os.sched_getscheduler(rank.pid) == os.SCHED_OTHER
    for rank in ranks:
        rank.terminate()
        rank.communicate(timeout=WAIT_S)


def test_kill_9_of_the_rank_leaves_no_loader_process(lab: Lab) -> None:
    ranks = lab.ring(10_000, 2, 2, 5)
    pids = running_workers(ranks[1], 2)
    ranks[1].kill()
    ranks[1].communicate(timeout=WAIT_S)
    assert gone(pids)  # the kernel killed them with their parent (PR_SET_PDEATHSIG)


def test_a_vanished_storage_host_ends_the_run_in_one_line(lab: Lab) -> None:
    ranks = lab.ring(10_000, 1, 2, 5)
    pids = [running_workers(rank, 1) for rank in ranks]
    time.sleep(0.3)  # into the steps
    lab.stop_server()
    for r, rank in enumerate(ranks):
        _, err = rank.communicate(timeout=WAIT_S)
        assert rank.returncode == 1, err
        assert err.count("\n") == 1, err
        assert gone(pids[r], timeout_s=0.5)
    # Each rank fails on its own loader or on the other rank; at least one says why.
    errors = [json.loads((lab.tmp / f"rank{r}.json").read_text())["error"] for r in range(2)]
    assert any(e.startswith("loader worker 0 (127.0.0.1:") for e in errors), errors


def test_the_live_file_holds_every_step_s_parts_as_spans(lab: Lab) -> None:
    """With ``--live-file`` a rank's last write (made after its last step) holds each step's
    parts as spans on the rank's own clock: the same boundaries its JSON stamps, so a live
    lane ends as the result does."""
    results = lab.results(lab.ring(8, 1, 1, 40, live=True))
    for r, res in enumerate(results):
        doc = json.loads((lab.tmp / f"rank{r}.live.json").read_text())
        # 8 steps of about 0.1 s: the first write, at least one when due, the last one.
        assert doc["rank"] == r and res["live_writes"] >= 2, res["live_writes"]
        spans = doc["spans"]
        assert all(b is not None for _, _, b in spans)    # the rank ended: nothing still on
        want = [(p, s[a], s[b]) for s in res["steps"]
                for p, a, b in (("data_wait", "t_start", "t_batch"),
                                ("compute", "t_batch", "t_compute_end"),
                                ("exposed_comm", "t_compute_end", "t_comm_end"),
                                ("barrier", "t_comm_end", "t_end"))]
        want = [w for w in want if w[2] > w[1]]    # a part of no length has no span
        assert [s[0] for s in spans] == [w[0] for w in want]
        for (state, a, b), (_, wa, wb) in zip(spans, want, strict=True):
            assert (a, b) == (pytest.approx(wa, abs=2e-6), pytest.approx(wb, abs=2e-6)), state
        assert doc["now"] >= spans[-1][2]
        # 40 ms of preprocessing a batch on one worker: the GPU waits, so every part shows.
        assert {s[0] for s in spans} == {"data_wait", "compute", "exposed_comm", "barrier"}


def test_without_a_live_file_a_rank_writes_none(lab: Lab) -> None:
    results = lab.results(lab.ring(3, 1, 1, 0))
    assert [r["live_writes"] for r in results] == [0, 0]
    assert not list(lab.tmp.glob("*.live.json"))
