"""A training rank's input pipeline: PyTorch's ``DataLoader`` with worker processes, modelled.

A real step cannot start before its input batch is in hand. PyTorch's loader runs
``num_workers`` worker *processes*; the rank keeps ``prefetch_factor`` batches requested per
worker and takes batches in order, batch i from worker i mod N, asking for batch i + N·K as it
takes batch i. Each worker here does what a dataset worker does: it fetches the batch's bytes
from a storage host over its own TCP connection (``storage serve``'s batch mode: an 8-byte
length asked, that many bytes answered) and then preprocesses it, burning ``cpu_ms`` of real
CPU. Processes, not threads: the burn is real Python work, which threads would serialise on
the GIL - and on a busy host the burn takes longer in wall time than in CPU time, which is
exactly how "CPU preprocessing falls behind" shows in a real job. Workers run at idle
priority (``SCHED_IDLE``): on an emulator's few cores a starved preprocessing is the cause
being modelled, a starved switch would be a broken emulation; the lab counts their CPU as
idle when it judges fidelity (``lab.measure.telemetry.SpareWork``).

Every connection is made by the rank from a fixed source address and port (the lab counts
connections by 5-tuple) before the workers are forked, so a storage host that is not there
fails the run in the rank with one clear line, and the rank can still read each connection's
TCP_INFO at the end. A worker hands the rank a small token per batch (index, bytes, when it
fetched and finished, the CPU it burnt) through a pipe; the batch's bytes stay in the worker,
as a real loader's pinned-memory copy is no network traffic. Workers die with the rank
(``PR_SET_PDEATHSIG``), and are stopped and reaped by PID on every way out.

This runs inside hosts: standard library only, nothing of the lab.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import socket
import struct
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lab.agents.common import STOP_SIGNALS, pdeathsig_setter
from lab.agents.storage import BATCH_HELLO, BATCH_LENGTH
from lab.agents.workerbase import (
    CollectiveError,
    connect,
    connection_record,
    finish_connection,
    fmt_addr,
    now,
    stamp,
)

#: A training step's parts with an input pipeline, in the order a step lives them: the wait
#: for its batch, the compute, the all-reduce beyond the compute (its exposed part) and the
#: wait for the slowest rank. Every rank that has a loader (the synthetic ring's, DDP's)
#: stamps them on one clock and writes them under these keys, so they add up to its
#: ``step_s``; the lab reads them by these names.
STEP_PARTS = ("data_wait_s", "compute_s", "exposed_comm_s", "barrier_s")
#: Rank → worker: the index of a batch to make.
REQUEST = struct.Struct("=q")
#: Worker → rank: index, bytes, request taken, bytes in, preprocessed (monotonic), CPU burnt.
#: 48 bytes, far under PIPE_BUF, so a token is written and read whole. A worker that fails
#: sends index -1 and the length of the one-line reason that follows, for the rank to report.
TOKEN = struct.Struct("=qqdddd")
#: The longest failure reason a worker sends (token and reason stay under PIPE_BUF).
REASON_BYTES = 400
#: Bytes asked of ``recv_into`` at a time while a batch arrives.
RECV_BYTES = 256 * 1024
#: How long a normal end waits for idle workers to exit on their own before killing them.
EXIT_WAIT_S = 1.0


def burn_cpu(seconds: float) -> float:
    """Spin until this thread has used ``seconds`` of CPU time; return the CPU time used.

    Measured on the thread's CPU clock, not the wall clock: on a host whose cores are busy
    the same work takes longer in wall time, as a real transform does.
    """
    t0 = time.thread_time()
    end, x = t0 + seconds, 1
    while (t := time.thread_time()) < end:
        for _ in range(256):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
    return t - t0


def _die_with_parent(parent: int, mask: set[signal.Signals]) -> None:
    """In a forked worker: default stop signals, death with the rank, the rank's signal mask.

    The rank's handlers raise an exception meant for the rank; a worker must simply die when
    stopped by PID, and be killed by the kernel if the rank is killed outright (kill -9).
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    pdeathsig_setter()(parent)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _readable(fd: int, timeout_s: float) -> bool:
    """Whether a pipe has data (or its end) within ``timeout_s``."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


def _send_failure(tokens: int, exc: BaseException) -> None:
    """Tell the rank why this worker stops, as a token the rank reads in turn."""
    reason = f"{type(exc).__name__}: {exc}".encode(errors="replace")[:REASON_BYTES]
    with contextlib.suppress(OSError):
        os.write(tokens, TOKEN.pack(-1, len(reason), 0, 0, 0, 0) + reason)


def _read_exact(fd: int, size: int) -> bytes | None:
    """``size`` bytes from a pipe, or None at its end."""
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _fetch(sock: socket.socket, buf: memoryview, nbytes: int) -> None:
    """Ask the storage host for ``nbytes`` and receive them all."""
    sock.sendall(BATCH_LENGTH.pack(nbytes))
    left = nbytes
    while left:
        n = sock.recv_into(buf[:min(left, len(buf))])
        if not n:
            raise ConnectionError("the storage host closed the connection")
        left -= n


def _work(sock: socket.socket, requests: int, tokens: int, batch_bytes: int,
          cpu_s: float) -> None:
    """A worker's life: for every requested index, fetch, preprocess, hand over a token."""
    buf = memoryview(bytearray(min(batch_bytes, RECV_BYTES)))
    sock.sendall(BATCH_HELLO)
    while (req := _read_exact(requests, REQUEST.size)) is not None:
        t_taken = now()
        _fetch(sock, buf, batch_bytes)
        t_fetched = now()
        used = burn_cpu(cpu_s)
        os.write(tokens, TOKEN.pack(REQUEST.unpack(req)[0], batch_bytes, t_taken, t_fetched,
                                    now(), used))


class _Worker:
    """The rank's side of one worker: its process, pipes, connection and what it delivered."""

    def __init__(self, index: int, sock: socket.socket, storage: tuple[str, int],
                 t_open: float) -> None:
        self.index, self.sock, self.storage = index, sock, storage
        self.record = connection_record(0, sock, t_open)
        del self.record["epoch"]
        self.pid: int | None = None
        self.requests = self.tokens = -1
        self.batches = self.bytes = 0
        self.fetch_s = self.prep_cpu_s = self.prep_wall_s = 0.0
        self.cpu_s: float | None = None
        self.exit: int | None = None

    def summary(self) -> dict[str, Any]:
        return {"worker": self.index, "pid": self.pid, "storage": fmt_addr(self.storage),
                "batches": self.batches, "bytes": self.bytes, "fetch_s": stamp(self.fetch_s),
                "prep_cpu_s": stamp(self.prep_cpu_s), "prep_wall_s": stamp(self.prep_wall_s),
                "cpu_s": None if self.cpu_s is None else stamp(self.cpu_s),
                "exit": self.exit, **self.record}


class Loader:
    """``workers`` processes making ``total`` batches, ``prefetch`` requested per worker.

    Batch i comes from worker i mod N; :meth:`next_batch` takes the batches in order.
    """

    def __init__(self, storage: list[tuple[str, int]], bind: str, sports: list[int],
                 prefetch: int, batch_bytes: int, cpu_ms: float, total: int) -> None:
        self.storage, self.bind, self.sports = storage, bind, sports
        self.prefetch, self.batch_bytes, self.cpu_ms, self.total = (prefetch, batch_bytes,
                                                                    cpu_ms, total)
        self.workers: list[_Worker] = []
        self.requested = 0
        self.taken = 0
        self.queue_empty_steps = 0
        self.data_wait_s = 0.0

    @classmethod
    def from_args(cls, args: Any, bind: str, total: int) -> Loader:
        """The loader a rank's command line asks for (``--storage`` and the options beside
        it, :mod:`lab.agents.worker`), its connections from ``bind``, ``total`` batches."""
        return cls(args.storage, args.loader_bind or bind, args.loader_sports, args.prefetch,
                   args.batch_bytes, args.cpu_ms, total)

    def start(self, deadline: float) -> None:
        """Connect every worker's storage connection and fork the workers; no batch is
        asked for until :meth:`prime`.

        Call it before the rank starts any thread: forking a process with threads copies
        locks another thread may hold. Asking is separate because a rank that must fork
        early (before torch starts its threads) may have to wait for the lab's go before
        any batch crosses the fabric, so that the switches count every batch it takes.
        """
        for i, sport in enumerate(self.sports):
            dst = self.storage[i % len(self.storage)]
            t_open = now()
            sock = connect((self.bind, sport), dst, None, deadline, f"loader worker {i}'s storage")
            self.workers.append(_Worker(i, sock, dst, t_open))
        for w in self.workers:
            self._fork(w)

    def prime(self) -> None:
        """Ask for the first batches: ``prefetch`` per worker (fewer if the job is shorter)."""
        while self.requested < min(self.total, len(self.workers) * self.prefetch):
            self._request()

    def _fork(self, w: _Worker) -> None:
        """Fork one worker with SIGTERM/SIGINT blocked, so a stop cannot land before its PID
        is known (and the worker cannot run the rank's handler)."""
        req_r, req_w = os.pipe()
        tok_r, tok_w = os.pipe()
        w.requests, w.tokens = req_w, tok_r  # the rank's ends, closed by stop() in any case
        parent = os.getpid()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            pid = os.fork()
            if pid == 0:
                self._child(w, (parent, mask), req_r, tok_w)
            w.pid = pid
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            if os.getpid() == parent:
                os.close(req_r)
                os.close(tok_w)

    def _child(self, w: _Worker, rank: tuple[int, set[signal.Signals]], requests: int,
               tokens: int) -> None:
        """The forked worker: keep only its own ends, work, and never return into the rank."""
        code = 0
        try:
            _die_with_parent(*rank)
            # Idle priority: the burn takes only CPU nobody else wants, so a host whose
            # preprocessing cannot keep up never starves the emulation (the switches, the
            # links' shaping, the ranks' own networking) on the cores it shares with them.
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            for other in self.workers:  # the rank's ends of every pipe, others' connections
                if other is not w:
                    other.sock.close()
                for fd in (other.requests, other.tokens):
                    if fd >= 0:
                        os.close(fd)
            _work(w.sock, requests, tokens, self.batch_bytes, self.cpu_ms / 1000)
        except BaseException as exc:  # whatever it is, the worker must not return to the rank
            _send_failure(tokens, exc)  # the rank says it, in its one line on stderr
            code = 1
        finally:
            os._exit(code)  # no atexit, no flushing the rank's copied stdout buffer

    def _request(self) -> None:
        """Ask the next batch of the worker whose turn it is (round-robin)."""
        w = self.workers[self.requested % len(self.workers)]
        # A worker that has failed is reported when its batch is due (its reason is queued).
        with contextlib.suppress(BrokenPipeError):
            os.write(w.requests, REQUEST.pack(self.requested))
        self.requested += 1

    def _queue_depth(self) -> int:
        """Batches made and not yet taken, over all workers (0: the queue is empty)."""
        ready = 0
        for w in self.workers:
            raw = fcntl.ioctl(w.tokens, termios.FIONREAD, b"\0\0\0\0")
            ready += struct.unpack("i", raw)[0] // TOKEN.size
        return ready

    def next_batch(self, timeout_s: float) -> dict[str, Any]:
        """Wait for the next batch in order; return its entry for the step's JSON.

        Asking for batch i + N·K right after taking batch i keeps N·K batches in flight, as
        PyTorch's loader does.
        """
        t_ask = now()
        index = self.taken
        w = self.workers[index % len(self.workers)]
        depth = self._queue_depth()
        ready = _readable(w.tokens, 0)
        if not ready and not _readable(w.tokens, timeout_s):
            raise CollectiveError(f"loader worker {w.index} made no batch in {timeout_s:g} s")
        raw = _read_exact(w.tokens, TOKEN.size)
        if raw is None:
            raise CollectiveError(f"loader worker {w.index} (pid {w.pid}) ended before batch "
                                  f"{index}")
        got, nbytes, t_taken, t_fetched, t_ready, cpu = TOKEN.unpack(raw)
        if got < 0:
            reason = (_read_exact(w.tokens, nbytes) or b"").decode(errors="replace")
            raise CollectiveError(f"loader worker {w.index} "
                                  f"({fmt_addr(w.storage)}): {reason}")
        self.taken += 1
        if self.requested < self.total:
            self._request()
        self.queue_empty_steps += depth == 0
        w.batches, w.bytes = w.batches + 1, w.bytes + nbytes
        w.fetch_s += t_fetched - t_taken
        w.prep_cpu_s += cpu
        w.prep_wall_s += t_ready - t_fetched
        self.data_wait_s += now() - t_ask
        return {"index": got, "worker": w.index, "queue_depth": depth, "ready": ready,
                "fetch_s": stamp(t_fetched - t_taken), "prep_cpu_s": stamp(cpu),
                "prep_wall_s": stamp(t_ready - t_fetched), "t_ready": stamp(t_ready)}

    def finish(self) -> None:
        """A normal end: no more requests, so idle workers exit on their own; then stop."""
        for w in self.workers:
            if w.requests >= 0:
                os.close(w.requests)
                w.requests = -1
        deadline = now() + EXIT_WAIT_S
        while any(w.exit is None for w in self.workers if w.pid) and now() < deadline:
            for w in self.workers:
                self._reap(w, os.WNOHANG)
            time.sleep(0.005)
        self.stop()

    def stop(self) -> None:
        """Every way out: kill what is left by PID, reap it, record each connection, close."""
        for w in self.workers:
            if w.pid and w.exit is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.pid, signal.SIGKILL)
                self._reap(w, 0)
            for fd in (w.requests, w.tokens):
                if fd >= 0:
                    os.close(fd)
            w.requests = w.tokens = -1
            if w.sock.fileno() >= 0:
                finish_connection(w.record, w.sock, graceful=False)
                w.sock.close()

    @staticmethod
    def _reap(w: _Worker, flags: int) -> None:
        """Reap a worker if it has ended; keep its exit status and the CPU it used in all."""
        if w.pid is None or w.exit is not None:
            return
        try:
            pid, status, usage = os.wait4(w.pid, flags)
        except ChildProcessError:
            w.exit = -1
            return
        if pid:
            w.exit = os.waitstatus_to_exitcode(status)
            w.cpu_s = usage.ru_utime + usage.ru_stime

    def summary(self) -> dict[str, Any]:
        """The run's loader: its parameters, how often the rank found nothing ready, and what
        each worker fetched and burnt (``cpu_s``: the whole process, from the kernel)."""
        return {"workers": len(self.sports), "prefetch": self.prefetch,
                "batch_bytes": self.batch_bytes, "cpu_ms": self.cpu_ms,
                "storage": [fmt_addr(s) for s in self.storage], "steps": self.taken,
                "queue_empty_steps": self.queue_empty_steps,
                "data_wait_s": stamp(self.data_wait_s),
                "per_worker": [w.summary() for w in self.workers]}


@dataclass(frozen=True)
class StepInput:
    """A step's start and its batch, on the rank's clock: when the step began, when its
    batch was in hand (the same instant without a loader) and the batch's entry."""

    t_start: float
    t_batch: float
    batch: dict[str, Any] | None

    def parts(self, exposed_comm_s: float) -> dict[str, Any]:
        """What a step with a batch adds to its JSON entry, beside the ``compute_s`` (from
        ``t_batch`` on) and ``barrier_s`` every step has: its data wait, the all-reduce's
        exposed part, the batch. Nothing without a loader."""
        if self.batch is None:
            return {}
        return {"t_batch": stamp(self.t_batch),
                "data_wait_s": stamp(self.t_batch - self.t_start),
                "exposed_comm_s": stamp(exposed_comm_s), "batch": self.batch}


def wait_for_batch(loader: Loader | None, timeout_s: float,
                   waiting: Callable[[float], None] | None = None) -> StepInput:
    """Begin a step as a real one begins: with the wait for its input batch (none without a
    loader). ``waiting`` hears when a wait starts (a live view opens its span then)."""
    t_start = now()
    if loader is None:
        return StepInput(t_start, t_start, None)
    if waiting is not None:
        waiting(t_start)
    batch = loader.next_batch(timeout_s)
    return StepInput(t_start, now(), batch)
