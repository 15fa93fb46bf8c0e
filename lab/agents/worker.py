"""Synthetic GPU workers: training steps whose end waits for the network.

``python -m lab.agents.worker ring`` is one data-parallel training rank (one "GPU"). Every step it
computes (sleeps), all-reduces its gradients with a **ring All-Reduce** over real TCP, then joins
a barrier - the pattern of NCCL's ring algorithm. A ring All-Reduce cannot finish before its
slowest hop has carried its share, so one congested or ECMP-collided link stalls *every* GPU;
that is what the lab reproduces and measures. ``incast-sink``/``incast-send`` reproduce the
synchronised many-to-one phase of collectives: M senders answer one "go" at the same instant
and the sink's step ends with the last byte.

Every connection's 5-tuple is fixed on the command line (``--bind`` plus ``--sports``/``--sport``)
so the lab can count each connection's packets on every switch before the run starts.
Timestamps are absolute ``time.monotonic()`` seconds: one clock for every network namespace of
the machine, so the lab can line ranks up against each other and against switch counters.

Command lines::

    python -m lab.agents.worker ring --rank R --world N --listen IP:PORT --next IP:PORT \\
        --bind IP --sports P1[,P2...] --size BYTES --steps K [--warmup 1] [--compute-s 0.1] \\
        [--jitter-s 0] [--seed 0] [--straggler-rank -1] [--straggler-s 0] [--buckets 1] \\
        [--epoch-steps 0] [--cc NAME] [--connect-timeout-s 30] [--io-timeout-s 60] [--out FILE]
    python -m lab.agents.worker incast-sink --listen IP:PORT --senders M --burst BYTES \\
        --steps K [--gap-s 0.05] [--connect-timeout-s 30] [--io-timeout-s 60] [--out FILE]
    python -m lab.agents.worker incast-send --connect IP:PORT --bind IP --sport P [--cc NAME] \\
        [--connect-timeout-s 30] [--io-timeout-s 60] [--out FILE]

Each writes one JSON document to ``--out`` (default stdout) when it ends - also when stopped by
SIGTERM/SIGINT or failing, with ``error`` saying why. Exit status: 0 done; 1 the run broke (a
peer vanished, a timeout; one line on stderr, no traceback); 2 bad input (one line on stderr
naming the field, nothing started, no JSON); 128+signal when stopped by a signal.

Ring JSON: ``mode: "ring"``, ``rank``, ``world``, ``size_bytes``, ``buckets``, ``cc`` (the
congestion control in use), ``clock: "monotonic"``, ``t_ready`` (start barrier done), ``cpu_s``,
``error`` (null or a sentence), the run's parameters, and

* ``steps``: ``step``, ``epoch``, ``warmup``, absolute ``t_start``, ``t_compute_end``,
  ``t_comm_start`` (first bucket's first send), ``t_comm_end`` (last bucket done), ``t_end``
  (barrier done); ``compute_s``, ``comm_s`` = t_comm_end − t_comm_start, ``barrier_s`` =
  t_end − t_comm_end, ``step_s``, ``idle_s`` = step_s − compute_s (the GPU not computing), and
  ``retrans`` (segments retransmitted on the outgoing connection during the step). Without
  overlap step_s = compute_s + comm_s + barrier_s; with ``--buckets`` > 1 comm overlaps compute.
* ``connections``: one per epoch, the connection this rank opened to the next rank (all the
  data it sends): ``epoch``, ``src``, ``sport``, ``dst``, ``dport``, ``t_open``, ``t_close``,
  ``cc`` and the TCP_INFO fields of :data:`TCP_INFO_FIELDS` read just before closing
  (``retransmits``, ``bytes_acked``, ``rtt_us``, ``snd_cwnd``, ``ce_seen``, ...).

Incast sink JSON: ``mode: "incast"``, ``role: "sink"``, ``senders``, ``burst_bytes``, ``gap_s``,
``sender_addrs`` (``src``/``sport``, sorted by address), ``steps`` (``step``, ``t_start`` = the
"go", ``t_end`` = last byte, ``step_s``, ``per_sender_s`` in sender_addrs order,
``goodput_mbps``), ``cpu_s``, ``error``. Sender JSON: ``role: "sender"``, its 5-tuple,
``burst_bytes`` (learnt from the sink), ``steps`` (``t_go``, ``t_written``), ``connections``
(one entry, as in the ring), ``cpu_s``, ``error``.

Kernel knobs that shape the result (``net.ipv4.tcp_slow_start_after_idle`` above all: a compute
gap is "idle") are the lab's to set per namespace, not this program's.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import queue
import random
import resource
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Protocol

#: Exit status of a run that broke (peer gone, timeout) and of bad input.
EXIT_FAILED, EXIT_USAGE = 1, 2
#: SO_RCVLOWAT while a chunk has more than this left: poll() then wakes us once per 64 kB
#: instead of once per packet, which is what keeps 8 ranks on 2 cores mostly idle.
LOWAT_BYTES = 64 * 1024
#: How long closing a connection waits for its last bytes to be acknowledged, so that
#: ``bytes_acked`` counts everything this process sent on it.
ACK_WAIT_S = 0.5
#: Pause between connection attempts while a peer is not listening yet.
RETRY_S = 0.05
#: The incast sink tells each sender the burst size in this header, right after accepting it.
INCAST_HELLO = struct.Struct("!Q")
#: The sink's per-step "go" byte.
GO = b"g"
#: connect() failing like this means the peer (or our address) is not there *yet*: retry.
_RETRY_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH,
                           errno.ETIMEDOUT, errno.EADDRINUSE, errno.EADDRNOTAVAIL,
                           errno.ECONNRESET, errno.ECONNABORTED})

#: ``(json name, struct format, byte offset)`` of the ``struct tcp_info`` fields we report, from
#: include/uapi/linux/tcp.h (offsets checked with ``offsetof`` against the 6.1 headers; the
#: layout only ever grows at the end). The kernel copies min(asked, sizeof) bytes, so a field
#: is reported only if the returned buffer covers it. Times are microseconds.
TCP_INFO_FIELDS: tuple[tuple[str, str, int], ...] = (
    ("ca_state", "B", 1),            # tcpi_ca_state: 0 open, 1 disorder, 2 CWR, 3 recovery, 4 loss
    ("rto_us", "I", 8),              # tcpi_rto
    ("snd_mss", "I", 16),            # tcpi_snd_mss
    ("unacked", "I", 24),            # tcpi_unacked: segments in flight
    ("lost", "I", 32),               # tcpi_lost
    ("rtt_us", "I", 68),             # tcpi_rtt: smoothed RTT
    ("rttvar_us", "I", 72),          # tcpi_rttvar
    ("snd_ssthresh", "I", 76),       # tcpi_snd_ssthresh (2147483647 = never set)
    ("snd_cwnd", "I", 80),           # tcpi_snd_cwnd, segments
    ("reordering", "I", 88),         # tcpi_reordering
    ("retransmits", "I", 100),       # tcpi_total_retrans: segments retransmitted, whole life
    ("bytes_acked", "Q", 120),       # tcpi_bytes_acked
    ("bytes_received", "Q", 128),    # tcpi_bytes_received
    ("segs_out", "I", 136),          # tcpi_segs_out
    ("notsent_bytes", "I", 144),     # tcpi_notsent_bytes
    ("min_rtt_us", "I", 148),        # tcpi_min_rtt
    ("delivery_rate_bytes_s", "Q", 160),  # tcpi_delivery_rate
    ("busy_us", "Q", 168),           # tcpi_busy_time
    ("rwnd_limited_us", "Q", 176),   # tcpi_rwnd_limited
    ("sndbuf_limited_us", "Q", 184),  # tcpi_sndbuf_limited
    ("delivered", "I", 192),         # tcpi_delivered
    ("ce_seen", "I", 196),           # tcpi_delivered_ce: delivered segments the receiver saw CE on
    ("bytes_sent", "Q", 200),        # tcpi_bytes_sent
    ("bytes_retrans", "Q", 208),     # tcpi_bytes_retrans
    ("dsack_dups", "I", 216),        # tcpi_dsack_dups
    ("reord_seen", "I", 220),        # tcpi_reord_seen
)
_TOTAL_RETRANS_OFFSET, _UNACKED_OFFSET, _NOTSENT_OFFSET = 100, 24, 144
#: Bytes asked for: more than any kernel's struct tcp_info so far (232 in 6.1, ~250 in 6.x).
TCP_INFO_LEN = 256


class UsageError(Exception):
    """Bad input: reported as one line naming the field, exit status 2, nothing started."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")


class CollectiveError(Exception):
    """The run cannot go on (a peer vanished, nothing arrived in time): ends it with status 1."""


class StopRequestedError(Exception):
    """SIGTERM or SIGINT arrived: stop, write what we have, exit 128+signal."""


# --------------------------------------------------------------------------------------------
# Small helpers: time, signals, output, TCP_INFO
# --------------------------------------------------------------------------------------------


def _now() -> float:
    return time.monotonic()


def _sleep_until(deadline: float) -> None:
    """Sleep to an absolute time, so overshoot in one compute part does not add up over parts."""
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _on_signal(signum: int, _frame: object) -> None:
    raise StopRequestedError(signal.Signals(signum).name)


def _catch_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_signal)


def _ignore_signals() -> None:
    """A second SIGTERM must not cut the clean-up or the summary short."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


def _write_json(data: dict[str, Any], out: str | None) -> None:
    text = json.dumps(data, indent=1)
    if out:
        tmp = Path(out + ".tmp")
        tmp.write_text(text + "\n")
        tmp.replace(out)  # readers never see half a file
    else:
        print(text, flush=True)


def _cpu_s() -> float:
    """CPU time of this process (all threads): the lab checks the workers stay cheap."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return round(ru.ru_utime + ru.ru_stime, 4)


def _r(t: float) -> float:
    """Microsecond precision is all a timestamp here carries; fewer digits keep the JSON small."""
    return round(t, 6)


def tcp_info(sock: socket.socket) -> dict[str, Any]:
    """What TCP itself says about a connection: retransmits, bytes acked, RTT, cwnd, CE marks."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)
    info: dict[str, Any] = {}
    for name, fmt, offset in TCP_INFO_FIELDS:
        if offset + struct.calcsize(fmt) <= len(raw):
            info[name] = struct.unpack_from("=" + fmt, raw, offset)[0]
    info["cc"] = _congestion_control(sock)
    return info


def _tcp_u32(sock: socket.socket, offset: int) -> int:
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)
    return struct.unpack_from("=I", raw, offset)[0] if offset + 4 <= len(raw) else 0


def _congestion_control(sock: socket.socket) -> str:
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
    return raw.split(b"\0", 1)[0].decode()


def _wait_acked(sock: socket.socket, timeout_s: float = ACK_WAIT_S) -> None:
    """Give the last bytes a moment to be acknowledged, so bytes_acked/retransmits are final."""
    deadline = _now() + timeout_s
    with contextlib.suppress(OSError):
        while _tcp_u32(sock, _UNACKED_OFFSET) or _tcp_u32(sock, _NOTSENT_OFFSET):
            if _now() > deadline:
                return
            time.sleep(0.002)


# --------------------------------------------------------------------------------------------
# Sockets with fixed 5-tuples
# --------------------------------------------------------------------------------------------


def _fmt(addr: tuple[str, int]) -> str:
    return f"{addr[0]}:{addr[1]}"


def _tcp_socket(cc: str | None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Chunks and tokens must leave at once: Nagle would hold the last partial segment of a chunk
    # (and every barrier token) for an ACK, adding an RTT per round that real NICs never add.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if cc:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
    return sock


def connect(bind: tuple[str, int], dst: tuple[str, int], cc: str | None,
            deadline: float, what: str) -> socket.socket:
    """Connect from a fixed source address and port, retrying while the peer is not up yet.

    Peers start at slightly different times; the source port is fixed because the lab installs
    per-5-tuple counters before the run.
    """
    while True:
        sock = _tcp_socket(cc)
        try:
            sock.bind(bind)
            sock.settimeout(max(0.1, deadline - _now()))
            sock.connect(dst)
            sock.settimeout(None)
            return sock
        except OSError as exc:
            sock.close()
            retry = exc.errno in _RETRY_ERRNOS or isinstance(exc, TimeoutError)
            if not retry or _now() + RETRY_S > deadline:
                reason = exc.strerror or str(exc)
                raise CollectiveError(f"cannot connect to {what} {_fmt(dst)} from "
                                      f"{_fmt(bind)}: {reason}") from None
        time.sleep(RETRY_S)


def listen(addr: tuple[str, int], backlog: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise CollectiveError(f"cannot listen on {_fmt(addr)}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


def accept(listener: socket.socket, deadline: float, what: str
           ) -> tuple[socket.socket, tuple[str, int]]:
    """Accept one connection before ``deadline``; poll() so that SIGTERM still gets through."""
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    while True:
        left = deadline - _now()
        if left <= 0:
            raise CollectiveError(f"no connection from {what} on "
                                  f"{_fmt(listener.getsockname())} in time")
        if poller.poll(left * 1000):
            try:
                sock, peer = listener.accept()
            except (BlockingIOError, ConnectionAbortedError):
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock, peer


def _connection_record(epoch: int, sock: socket.socket, t_open: float) -> dict[str, Any]:
    src, dst = sock.getsockname(), sock.getpeername()
    return {"epoch": epoch, "src": src[0], "sport": src[1], "dst": dst[0], "dport": dst[1],
            "t_open": _r(t_open)}


def _finish_connection(record: dict[str, Any], sock: socket.socket, graceful: bool) -> None:
    """Add TCP_INFO to a connection's record, read just before it is closed."""
    if graceful:
        _wait_acked(sock)
    with contextlib.suppress(OSError):
        record.update(tcp_info(sock))
    record["t_close"] = _r(_now())


# --------------------------------------------------------------------------------------------
# Ring All-Reduce
# --------------------------------------------------------------------------------------------


class RingLink:
    """One rank's two ring connections: ``out`` to the next rank, ``inp`` from the previous one.

    Data only flows rank → next rank, so each connection carries one hop of the ring in one
    direction (ACKs come back) and the lab's counters for its 5-tuple measure exactly that hop.
    The All-Reduce and the barrier share the connections; the byte counts frame the stream.
    """

    def __init__(self, rank: int, world: int, io_timeout_s: float) -> None:
        self.rank, self.world, self.io_timeout_s = rank, world, io_timeout_s
        self.out: socket.socket | None = None
        self.inp: socket.socket | None = None
        self._token = memoryview(bytearray(world))
        self._lowat = 1
        # Peer addresses for error messages, kept because a dead socket no longer knows them.
        self._next_name = self._prev_name = "?"

    def attach(self, out: socket.socket, inp: socket.socket) -> None:
        out.setblocking(False)
        inp.setblocking(False)
        self.out, self.inp, self._lowat = out, inp, 1
        self._next_name, self._prev_name = _fmt(out.getpeername()), _fmt(inp.getpeername())

    def allreduce(self, buf: memoryview) -> None:
        """Ring All-Reduce of ``buf`` in place: reduce-scatter then all-gather, 2(N−1) rounds.

        Nothing is added up: a GPU reduces a chunk at hundreds of GB/s, far faster than the
        network delivers it, so the reduction costs no time worth modelling, and skipping it
        keeps the CPU free for the emulated network. The data dependencies are kept exactly: in
        round r a rank sends chunk (rank − r) mod N - in reduce-scatter the partial sum it
        received in round r − 1, in all-gather the finished chunk it received in round r − 1 -
        and receives chunk (rank − r − 1) mod N. The same formula covers both phases.
        """
        self.exchange(buf, len(buf) // self.world, 2 * (self.world - 1))

    def barrier(self) -> None:
        """Dissemination barrier over the ring: N−1 lock-step rounds of a 1-byte token.

        A rank's k-th token leaves only after its (k−1)-th token arrived, so its (N−1)-th arriving
        proves every other rank has entered the barrier.
        """
        self.exchange(self._token, 1, self.world - 1)

    def exchange(self, buf: memoryview, chunk: int, rounds: int) -> None:
        """Run ``rounds`` lock-step ring rounds of ``chunk`` bytes over ``buf`` (N chunk slots).

        Sends and receives run concurrently (non-blocking sockets, one poll loop), but the chunk
        of round r leaves only once round r − 1's chunk has fully arrived, as in NCCL's ring: a
        rank never runs ahead of data it does not have, so one slow hop slows every rank.
        """
        assert self.out is not None and self.inp is not None
        total = rounds * chunk
        sent = got = 0
        out_fd, in_fd = self.out.fileno(), self.inp.fileno()
        poller = select.poll()
        masks = {out_fd: 0, in_fd: 0}
        deadline = _now() + self.io_timeout_s
        while sent < total or got < total:
            allowed = min(total, (got // chunk + 1) * chunk)
            self._want(poller, masks, out_fd, select.POLLOUT if sent < allowed else 0)
            if got < total:
                self._set_lowat(min(LOWAT_BYTES, chunk - got % chunk))
            self._want(poller, masks, in_fd, select.POLLIN if got < total else 0)
            ready = poller.poll(max(0.0, deadline - _now()) * 1000)
            if not ready:
                side = "data from the previous rank" if got < allowed else "the next rank to read"
                raise CollectiveError(f"waited {self.io_timeout_s:g} s for {side} "
                                      f"({got}/{total} bytes in, {sent}/{total} out)")
            moved = 0
            for fd, _events in ready:
                if fd == out_fd:
                    moved += (n := self._send(buf, sent, allowed, chunk))
                    sent += n
                else:
                    moved += (n := self._recv(buf, got, total, chunk))
                    got += n
            if moved:
                deadline = _now() + self.io_timeout_s

    @staticmethod
    def _want(poller: select.poll, masks: dict[int, int], fd: int, mask: int) -> None:
        """Poll a socket only for what we need now (an idle socket must not wake us)."""
        if masks[fd] == mask:
            return
        if mask:
            poller.register(fd, mask)  # registers or modifies
        else:
            poller.unregister(fd)
        masks[fd] = mask

    def _set_lowat(self, nbytes: int) -> None:
        """Be woken at 64 kB or at the end of the round, whichever is first - not per packet."""
        if nbytes != self._lowat:
            assert self.inp is not None
            self.inp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, nbytes)
            self._lowat = nbytes

    def _send(self, buf: memoryview, sent: int, allowed: int, chunk: int) -> int:
        """Write as much of the rounds we may send as the socket takes now; return the bytes."""
        assert self.out is not None
        done = 0
        while sent + done < allowed:
            pos = sent + done
            base = (self.rank - pos // chunk) % self.world * chunk
            start, end = base + pos % chunk, base + chunk
            try:
                n = self.out.send(buf[start:end])
            except BlockingIOError:
                break
            except OSError as exc:
                raise CollectiveError(f"next rank {self._next_name}: "
                                      f"{exc.strerror}") from None
            done += n
            if n < end - start:
                break
        return done

    def _recv(self, buf: memoryview, got: int, total: int, chunk: int) -> int:
        """Read what has arrived, up to the end of the step's rounds; return the bytes."""
        assert self.inp is not None
        done = 0
        while got + done < total:
            pos = got + done
            base = (self.rank - pos // chunk - 1) % self.world * chunk
            start, end = base + pos % chunk, base + chunk
            try:
                n = self.inp.recv_into(buf[start:end])
            except BlockingIOError:
                break
            except OSError as exc:
                raise CollectiveError(f"previous rank {self._prev_name}: "
                                      f"{exc.strerror}") from None
            if n == 0:
                raise CollectiveError(f"previous rank {self._prev_name} closed the "
                                      "connection")
            done += n
            if n < end - start:
                break
        return done


class CommWorker:
    """The communication stream: all-reduces gradient buckets in order while compute goes on.

    Frameworks (PyTorch DDP, Horovod) start a bucket's all-reduce as soon as its gradients are
    ready and overlap it with the backward pass of the layers still to go, so only the last
    bucket's all-reduce is fully exposed. A thread gives the same overlap: the main thread
    sleeps the next compute part while this one moves bytes on the same connections.
    """

    def __init__(self, link: RingLink, buckets: list[memoryview]) -> None:
        self._link, self._buckets = link, buckets
        self._todo: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[tuple[float, float] | BaseException] = queue.SimpleQueue()
        # Daemon: a SIGTERM in the main thread must not wait for an all-reduce to finish.
        self._thread = threading.Thread(target=self._run, name="comm", daemon=True)
        self._thread.start()

    def submit(self, bucket: int) -> None:
        self._todo.put(bucket)

    def wait(self, count: int) -> tuple[float, float]:
        """Wait for ``count`` submitted buckets; return (first send start, last completion)."""
        first = last = 0.0
        for i in range(count):
            item = self._done.get()
            if isinstance(item, BaseException):
                raise item
            if i == 0:
                first = item[0]
            last = item[1]
        return first, last

    def stop(self) -> None:
        self._todo.put(None)

    def _run(self) -> None:
        while (bucket := self._todo.get()) is not None:
            try:
                t0 = _now()
                self._link.allreduce(self._buckets[bucket])
                self._done.put((t0, _now()))
            except Exception as exc:  # handed to the main thread, which reports it
                self._done.put(exc)
                return


class RingRank:
    """One training rank: compute, ring All-Reduce, barrier; ``--steps`` times."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.link = RingLink(args.rank, args.world, args.io_timeout_s)
        bucket_bytes = args.size // args.buckets
        # Preallocated once: the steady state allocates nothing and copies nothing in Python.
        self.buckets = [memoryview(bytearray(bucket_bytes)) for _ in range(args.buckets)]
        self.rng = random.Random(args.seed + args.rank)
        self.steps: list[dict[str, Any]] = []
        self.connections: list[dict[str, Any]] = []
        self.listener: socket.socket | None = None
        self.worker: CommWorker | None = None
        self.epoch = -1
        self.conn: dict[str, Any] | None = None
        self.cc: str | None = args.cc
        self.t_ready: float | None = None

    # -- connections ---------------------------------------------------------------------------

    def _open_epoch(self, epoch: int) -> None:
        """Connect to the next rank from this epoch's source port; accept the previous rank's."""
        a = self.args
        deadline = _now() + a.connect_timeout_s
        t_open = _now()
        out = connect((a.bind, a.sports[epoch]), a.next, a.cc, deadline, "next rank")
        assert self.listener is not None
        try:
            inp, _peer = accept(self.listener, deadline, "the previous rank")
        except BaseException:
            out.close()
            raise
        self.link.attach(out, inp)
        self.epoch = epoch
        self.conn = _connection_record(epoch, out, t_open)
        self.cc = _congestion_control(out)

    def _close_epoch(self, graceful: bool = True) -> None:
        """Record the outgoing connection's TCP_INFO, then close both connections."""
        if self.link.out is not None and self.conn is not None:
            _finish_connection(self.conn, self.link.out, graceful)
            self.connections.append(self.conn)
        for sock in (self.link.out, self.link.inp):
            if sock is not None:
                sock.close()
        self.link.out = self.link.inp = None
        self.conn = None

    # -- steps ---------------------------------------------------------------------------------

    def _compute_time(self) -> float:
        a = self.args
        t = max(0.0, a.compute_s + self.rng.uniform(-a.jitter_s, a.jitter_s))
        return t + (a.straggler_s if a.rank == a.straggler_rank else 0.0)

    def _communicate(self, t_start: float, compute: float) -> tuple[float, float, float]:
        """Compute (sleep) and all-reduce; return (compute end, comm start, comm end)."""
        if self.worker is None:  # no overlap: inline, so no thread hand-off shows in the times
            _sleep_until(t_start + compute)
            t_compute_end = _now()
            self.link.allreduce(self.buckets[0])
            return t_compute_end, t_compute_end, _now()
        parts = len(self.buckets)
        for b in range(parts):
            _sleep_until(t_start + compute * (b + 1) / parts)
            self.worker.submit(b)
        t_compute_end = _now()
        t_comm_start, t_comm_end = self.worker.wait(parts)
        return t_compute_end, t_comm_start, t_comm_end

    def _step(self, step: int, epoch: int) -> dict[str, Any]:
        assert self.link.out is not None
        retrans0 = _tcp_u32(self.link.out, _TOTAL_RETRANS_OFFSET)
        t_start = _now()
        t_compute_end, t_comm_start, t_comm_end = self._communicate(t_start, self._compute_time())
        self.link.barrier()
        t_end = _now()
        compute_s, step_s = t_compute_end - t_start, t_end - t_start
        return {
            "step": step, "epoch": epoch, "warmup": step < self.args.warmup,
            "t_start": _r(t_start), "t_compute_end": _r(t_compute_end),
            "t_comm_start": _r(t_comm_start), "t_comm_end": _r(t_comm_end), "t_end": _r(t_end),
            "compute_s": _r(compute_s), "comm_s": _r(t_comm_end - t_comm_start),
            "barrier_s": _r(t_end - t_comm_end), "step_s": _r(step_s),
            "idle_s": _r(step_s - compute_s),
            "retrans": _tcp_u32(self.link.out, _TOTAL_RETRANS_OFFSET) - retrans0,
        }

    def run(self) -> None:
        a = self.args
        self.listener = listen(a.listen, backlog=16)
        if a.buckets > 1:
            self.worker = CommWorker(self.link, self.buckets)
        self._open_epoch(0)
        self.link.barrier()  # every rank starts step 0 together
        self.t_ready = _now()
        for step in range(a.steps):
            epoch = step // a.epoch_steps if a.epoch_steps else 0
            if epoch != self.epoch:
                # A new epoch re-rolls the ECMP hash (new source port), like a job restart or a
                # new queue pair; the barrier lines the ranks up again, outside step time.
                self._close_epoch()
                self._open_epoch(epoch)
                self.link.barrier()
            self.steps.append(self._step(step, epoch))
        self._close_epoch()

    def close(self) -> None:
        """Clean up after a normal end or a failure: record the open connection, close all."""
        self._close_epoch(graceful=False)
        if self.worker is not None:
            self.worker.stop()
        if self.listener is not None:
            self.listener.close()

    def summary(self, error: str | None) -> dict[str, Any]:
        a = self.args
        return {
            "mode": "ring", "rank": a.rank, "world": a.world, "size_bytes": a.size,
            "buckets": a.buckets, "cc": self.cc, "clock": "monotonic",
            "listen": _fmt(a.listen), "next": _fmt(a.next), "steps_requested": a.steps,
            "compute_s": a.compute_s, "jitter_s": a.jitter_s, "seed": a.seed,
            "straggler_rank": a.straggler_rank, "straggler_s": a.straggler_s,
            "epoch_steps": a.epoch_steps, "warmup": a.warmup,
            "t_ready": None if self.t_ready is None else _r(self.t_ready),
            "steps": self.steps, "connections": self.connections,
            "cpu_s": _cpu_s(), "error": error,
        }


# --------------------------------------------------------------------------------------------
# Incast
# --------------------------------------------------------------------------------------------


class IncastSink:
    """The one receiver of a many-to-one burst: says "go" to all senders at once, times the end."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.listener: socket.socket | None = None
        self.conns: list[socket.socket] = []
        self.peers: list[tuple[str, int]] = []
        self.steps: list[dict[str, Any]] = []
        self.scratch = memoryview(bytearray(1 << 20))
        self.t_ready: float | None = None

    def _accept_all(self) -> None:
        a = self.args
        self.listener = listen(a.listen, backlog=max(16, a.senders))
        deadline = _now() + a.connect_timeout_s
        hello = INCAST_HELLO.pack(a.burst)
        accepted: list[tuple[socket.socket, tuple[str, int]]] = []
        while len(accepted) < a.senders:
            sock, peer = accept(self.listener, deadline, f"{a.senders - len(accepted)} senders")
            sock.sendall(hello)
            sock.setblocking(False)
            accepted.append((sock, peer))
        # A fixed order (by address) makes per_sender_s comparable across runs.
        accepted.sort(key=lambda sp: (socket.inet_aton(sp[1][0]), sp[1][1]))
        self.conns = [s for s, _ in accepted]
        self.peers = [p for _, p in accepted]

    def run(self) -> None:
        a = self.args
        self._accept_all()
        self.t_ready = _now()
        for step in range(a.steps):
            time.sleep(a.gap_s)  # the "compute" between two synchronised phases
            self.steps.append(self._step(step))

    def _step(self, step: int) -> dict[str, Any]:
        a = self.args
        t_start = _now()
        for i, sock in enumerate(self.conns):
            try:
                sock.send(GO)  # 1 byte into an empty buffer: never blocks
            except OSError as exc:
                raise CollectiveError(f"sender {_fmt(self.peers[i])}: {exc.strerror}") from None
        done = self._collect(step)
        t_end = max(done)
        step_s = t_end - t_start
        return {"step": step, "t_start": _r(t_start), "t_end": _r(t_end), "step_s": _r(step_s),
                "per_sender_s": [_r(t - t_start) for t in done],
                "goodput_mbps": round(a.senders * a.burst * 8 / step_s / 1e6, 3)}

    def _collect(self, step: int) -> list[float]:
        """Read every sender's burst; return when each one's last byte arrived."""
        a = self.args
        left = [a.burst] * len(self.conns)
        done = [0.0] * len(self.conns)
        index = {s.fileno(): i for i, s in enumerate(self.conns)}
        poller = select.poll()
        for sock in self.conns:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, min(LOWAT_BYTES, a.burst))
            poller.register(sock, select.POLLIN)
        pending = len(self.conns)
        while pending:
            ready = poller.poll(a.io_timeout_s * 1000)
            if not ready:
                slow = [_fmt(self.peers[i]) for i, n in enumerate(left) if n]
                raise CollectiveError(f"step {step}: nothing from {', '.join(slow)} "
                                      f"for {a.io_timeout_s:g} s")
            for fd, _events in ready:
                i = index[fd]
                left[i] -= self._drain(i, left[i])
                if left[i] == 0:
                    done[i] = _now()
                    poller.unregister(fd)
                    pending -= 1
                else:
                    self.conns[i].setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT,
                                             min(LOWAT_BYTES, left[i]))
        return done

    def _drain(self, i: int, left: int) -> int:
        sock, done = self.conns[i], 0
        while done < left:
            want = min(left - done, len(self.scratch))
            try:
                n = sock.recv_into(self.scratch[:want])
            except BlockingIOError:
                break
            except OSError as exc:
                raise CollectiveError(f"sender {_fmt(self.peers[i])}: {exc.strerror}") from None
            if n == 0:
                raise CollectiveError(f"sender {_fmt(self.peers[i])} closed the connection")
            done += n
            if n < want:
                break
        return done

    def close(self) -> None:
        for sock in self.conns:
            sock.close()  # the senders see EOF: the run is over
        if self.listener is not None:
            self.listener.close()

    def summary(self, error: str | None) -> dict[str, Any]:
        a = self.args
        return {
            "mode": "incast", "role": "sink", "listen": _fmt(a.listen), "senders": a.senders,
            "burst_bytes": a.burst, "gap_s": a.gap_s, "steps_requested": a.steps,
            "clock": "monotonic", "t_ready": None if self.t_ready is None else _r(self.t_ready),
            "sender_addrs": [{"src": p[0], "sport": p[1]} for p in self.peers],
            "steps": self.steps, "cpu_s": _cpu_s(), "error": error,
        }


class IncastSender:
    """One of the many: on each "go" writes its burst as fast as TCP lets it."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sock: socket.socket | None = None
        self.conn: dict[str, Any] | None = None
        self.connections: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []
        self.burst: int | None = None
        self.cc: str | None = args.cc

    def run(self) -> None:
        a = self.args
        t_open = _now()
        self.sock = connect((a.bind, a.sport), a.connect, a.cc,
                            _now() + a.connect_timeout_s, "incast sink")
        self.conn = _connection_record(0, self.sock, t_open)
        self.cc = _congestion_control(self.sock)
        self.sock.settimeout(a.io_timeout_s)
        try:
            self.burst = INCAST_HELLO.unpack(self._recv_exact(INCAST_HELLO.size))[0]
            payload = memoryview(bytearray(self.burst))
            while self._recv_exact(1, eof_ok=True):
                t_go = _now()
                self.sock.sendall(payload)
                self.steps.append({"step": len(self.steps), "t_go": _r(t_go),
                                   "t_written": _r(_now())})
        except TimeoutError:
            raise CollectiveError(f"nothing from the sink for {a.io_timeout_s:g} s") from None
        except ConnectionError as exc:
            raise CollectiveError(f"incast sink {_fmt(a.connect)}: {exc.strerror}") from None
        self._close(graceful=True)

    def _recv_exact(self, n: int, eof_ok: bool = False) -> bytes:
        assert self.sock is not None
        data = b""
        while len(data) < n:
            more = self.sock.recv(n - len(data))
            if not more:
                if eof_ok and not data:
                    return b""  # the sink closed: all steps done
                raise CollectiveError("the incast sink closed the connection early")
            data += more
        return data

    def _close(self, graceful: bool) -> None:
        if self.sock is None:
            return
        if self.conn is not None:
            _finish_connection(self.conn, self.sock, graceful)
            self.connections.append(self.conn)
        self.sock.close()
        self.sock = self.conn = None

    def close(self) -> None:
        self._close(graceful=False)

    def summary(self, error: str | None) -> dict[str, Any]:
        a = self.args
        return {
            "mode": "incast", "role": "sender", "src": a.bind, "sport": a.sport,
            "dst": a.connect[0], "dport": a.connect[1], "burst_bytes": self.burst,
            "cc": self.cc, "clock": "monotonic", "steps": self.steps,
            "connections": self.connections, "cpu_s": _cpu_s(), "error": error,
        }


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


class _Worker(Protocol):
    def run(self) -> None: ...
    def close(self) -> None: ...
    def summary(self, error: str | None) -> dict[str, Any]: ...


def _run_and_report(worker: _Worker, out: str | None, who: str) -> int:
    """Run, always clean up and write the JSON; turn failures into one line and an exit status."""
    error: str | None = None
    code = 0
    _catch_signals()
    try:
        try:
            worker.run()
        finally:
            _ignore_signals()
            worker.close()
    except StopRequestedError as exc:
        error, code = f"stopped by {exc}", 128 + signal.Signals[str(exc)].value
    except CollectiveError as exc:
        error, code = str(exc), EXIT_FAILED
    except OSError as exc:
        error, code = f"{type(exc).__name__}: {exc.strerror or exc}", EXIT_FAILED
    except Exception as exc:  # a bug: keep the traceback, still write what we have
        traceback.print_exc()
        error, code = f"internal error: {type(exc).__name__}: {exc}", EXIT_FAILED
    _write_json(worker.summary(error), out)
    if error:
        print(f"{who}: {error}", file=sys.stderr)
    return code


def _addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    try:
        socket.inet_aton(host)
        value = int(port)
    except (OSError, ValueError):
        raise argparse.ArgumentTypeError(f"expected IP:PORT, got {text!r}") from None
    if not sep or not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"expected IP:PORT, got {text!r}")
    return host, value


def _ports(text: str) -> list[int]:
    try:
        ports = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected P1,P2,..., got {text!r}") from None
    return ports


def _check_cc(cc: str | None) -> None:
    """An unknown congestion control is bad input: say so before anything starts."""
    if not cc:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
        except OSError as exc:
            raise UsageError("cc", f"{cc!r} cannot be used here ({exc.strerror}); see "
                             "net.ipv4.tcp_available_congestion_control") from None


def _check_common(a: argparse.Namespace) -> None:
    if a.connect_timeout_s <= 0:
        raise UsageError("connect_timeout_s", "must be > 0")
    if a.io_timeout_s <= 0:
        raise UsageError("io_timeout_s", "must be > 0")
    _check_cc(getattr(a, "cc", None))


def validate_ring(a: argparse.Namespace) -> None:
    """Reject impossible rings before any socket exists (exit 2, one line naming the field)."""
    if a.world < 2:
        raise UsageError("world", f"a ring needs at least 2 ranks, got {a.world}")
    if not 0 <= a.rank < a.world:
        raise UsageError("rank", f"must be in 0..{a.world - 1}, got {a.rank}")
    if a.buckets < 1:
        raise UsageError("buckets", f"must be >= 1, got {a.buckets}")
    if a.size <= 0 or a.size % (a.world * a.buckets):
        raise UsageError("size_bytes", f"{a.size} must be a positive multiple of "
                         f"world*buckets = {a.world * a.buckets} (equal chunks per bucket)")
    if a.steps < 1:
        raise UsageError("steps", f"must be >= 1, got {a.steps}")
    if a.warmup < 0:
        raise UsageError("warmup", f"must be >= 0, got {a.warmup}")
    if a.epoch_steps < 0:
        raise UsageError("epoch_steps", f"must be >= 0, got {a.epoch_steps}")
    for name in ("compute_s", "jitter_s", "straggler_s"):
        if getattr(a, name) < 0:
            raise UsageError(name, f"must be >= 0, got {getattr(a, name)}")
    if not -1 <= a.straggler_rank < a.world:
        raise UsageError("straggler_rank", f"must be -1 (none) or 0..{a.world - 1}")
    epochs = math.ceil(a.steps / a.epoch_steps) if a.epoch_steps else 1
    if not a.sports:
        raise UsageError("sports", f"missing: --sports P1,... ({epochs} source port(s), one "
                         "per epoch)")
    if len(a.sports) < epochs:
        raise UsageError("sports", f"{len(a.sports)} source port(s) given, {a.steps} steps in "
                         f"epochs of {a.epoch_steps} need {epochs}")
    if len(set(a.sports)) != len(a.sports) or not all(0 < p < 65536 for p in a.sports):
        raise UsageError("sports", f"must be distinct ports 1..65535, got {a.sports}")
    _check_common(a)


def validate_incast(a: argparse.Namespace) -> None:
    if a.cmd == "incast-sink":
        for name, value in (("senders", a.senders), ("burst", a.burst), ("steps", a.steps)):
            if value < 1:
                raise UsageError(name, f"must be >= 1, got {value}")
        if a.gap_s < 0:
            raise UsageError("gap_s", f"must be >= 0, got {a.gap_s}")
    elif not 0 < a.sport < 65536:
        raise UsageError("sport", f"must be 1..65535, got {a.sport}")
    _check_common(a)


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (the lab logs one line per failed worker)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--connect-timeout-s", type=float, default=30.0,
                   help="give up connecting/accepting after this long (peers start late)")
    p.add_argument("--io-timeout-s", type=float, default=60.0,
                   help="give up when no byte moves for this long")
    p.add_argument("--out", help="JSON summary file (default: stdout)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="collective", description=__doc__.split("\n\n", 1)[0])
    sub = parser.add_subparsers(dest="cmd", required=True)

    ring = sub.add_parser("ring", help="one rank of a ring All-Reduce training job")
    ring.add_argument("--rank", type=int, required=True)
    ring.add_argument("--world", type=int, required=True, help="number of ranks N")
    ring.add_argument("--listen", type=_addr, required=True, help="IP:PORT for the previous rank")
    ring.add_argument("--next", type=_addr, required=True, help="the next rank's IP:PORT")
    ring.add_argument("--bind", required=True, help="source IP of the connection to next")
    ring.add_argument("--sports", type=_ports, help="source ports, one per epoch: P1,P2,...")
    ring.add_argument("--size", type=int, required=True, help="gradient bytes per step")
    ring.add_argument("--steps", type=int, required=True)
    ring.add_argument("--warmup", type=int, default=1, help="first steps marked warmup")
    ring.add_argument("--compute-s", type=float, default=0.1)
    ring.add_argument("--jitter-s", type=float, default=0.0, help="compute ± uniform jitter")
    ring.add_argument("--seed", type=int, default=0, help="jitter RNG seed (+ rank)")
    ring.add_argument("--straggler-rank", type=int, default=-1)
    ring.add_argument("--straggler-s", type=float, default=0.0)
    ring.add_argument("--buckets", type=int, default=1, help="gradient buckets (overlap)")
    ring.add_argument("--epoch-steps", type=int, default=0,
                      help="reconnect from the next source port every E steps (0: never)")
    ring.add_argument("--cc", help="TCP congestion control (default: the system's)")
    _add_common(ring)

    sink = sub.add_parser("incast-sink", help="receiver of synchronised many-to-one bursts")
    sink.add_argument("--listen", type=_addr, required=True)
    sink.add_argument("--senders", type=int, required=True)
    sink.add_argument("--burst", type=int, required=True, help="bytes per sender per step")
    sink.add_argument("--steps", type=int, required=True)
    sink.add_argument("--gap-s", type=float, default=0.05, help="compute gap before each go")
    _add_common(sink)

    send = sub.add_parser("incast-send", help="one sender of an incast")
    send.add_argument("--connect", type=_addr, required=True, help="the sink's IP:PORT")
    send.add_argument("--bind", required=True)
    send.add_argument("--sport", type=int, required=True)
    send.add_argument("--cc")
    _add_common(send)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "ring":
            validate_ring(args)
        else:
            validate_incast(args)
    except UsageError as exc:
        print(f"collective {args.cmd}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    factories: dict[str, Callable[[argparse.Namespace], _Worker]] = {
        "ring": RingRank, "incast-sink": IncastSink, "incast-send": IncastSender}
    who = f"collective {args.cmd}" + (f" rank {args.rank}" if args.cmd == "ring" else "")
    return _run_and_report(factories[args.cmd](args), args.out, who)


if __name__ == "__main__":
    sys.exit(main())
