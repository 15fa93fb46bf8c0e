"""What the collective programs share: the ring rank (:mod:`lab.agents.ring`), the DDP rank
(:mod:`lab.agents.ddprank`) and the incast sink and sender (:mod:`lab.agents.incast`), run
by :mod:`lab.agents.worker`.

They time on one clock (``time.monotonic()``, the same in every network namespace of the
machine, and rebased onto the head's on a cluster's other workers, so the lab can line
processes up against each other and against switch counters), report timestamps to the
microsecond, and open TCP connections whose 5-tuple is fixed on the command line, because
the lab installs per-5-tuple counters on every switch before the run.
A run that cannot go on raises :class:`CollectiveError`; the command line turns it into one
line on stderr and exit status 1.

This runs inside hosts: standard library only, nothing of the lab.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import select
import socket
import time
from collections import deque
from typing import Any

from lab.agents.common import NOTSENT_OFFSET, UNACKED_OFFSET, LiveFile, tcp_info, tcp_u32

#: SO_RCVLOWAT while a chunk has more than this left: poll() then wakes us once per 64 kB
#: instead of once per packet, which is what keeps 8 ranks on 2 cores mostly idle.
LOWAT_BYTES = 64 * 1024
#: How long closing a connection waits for its last bytes to be acknowledged, so that
#: ``bytes_acked`` counts everything this process sent on it.
ACK_WAIT_S = 0.5
#: Pause between connection attempts while a peer is not listening yet.
RETRY_S = 0.05
#: connect() failing like this means the peer (or our address) is not there *yet*: retry.
_RETRY_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH,
                           errno.ETIMEDOUT, errno.EADDRINUSE, errno.EADDRNOTAVAIL,
                           errno.ECONNRESET, errno.ECONNABORTED})


class CollectiveError(Exception):
    """The run cannot go on (a peer vanished, nothing arrived in time): ends it with status 1."""


# --------------------------------------------------------------------------------------------
# Time and output
# --------------------------------------------------------------------------------------------


#: A program on another machine of a cluster stamps on the head's clock: the lab hands it
#: its machine's offset from the head (``worker = head + offset``) in this variable.
CLOCK_OFFSET_ENV = "FABRICLAB_CLOCK_OFFSET_S"
_CLOCK_OFFSET_S = float(os.environ.get(CLOCK_OFFSET_ENV) or 0.0)


def now() -> float:
    """The one clock every namespace shares (and, over a cluster, the head's), so ranks and
    switch counters line up."""
    return time.monotonic() - _CLOCK_OFFSET_S


def stamp(t: float) -> float:
    """Microsecond precision is all a timestamp here carries; fewer digits keep the JSON small."""
    return round(t, 6)


def cpu_s() -> float:
    """CPU time of this process (all threads): the lab checks the workers stay cheap."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return round(ru.ru_utime + ru.ru_stime, 4)


# --------------------------------------------------------------------------------------------
# Sockets with fixed 5-tuples
# --------------------------------------------------------------------------------------------


def fmt_addr(addr: tuple[str, int]) -> str:
    """``IP:PORT``, the form the command line takes, for messages and the JSON."""
    return f"{addr[0]}:{addr[1]}"


def tcp_socket(cc: str | None) -> socket.socket:
    """A TCP socket as every collective connection needs it: reusable port, no Nagle, ``cc``."""
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
        sock = tcp_socket(cc)
        try:
            sock.bind(bind)
            sock.settimeout(max(0.1, deadline - now()))
            sock.connect(dst)
            sock.settimeout(None)
            return sock
        except OSError as exc:
            sock.close()
            retry = exc.errno in _RETRY_ERRNOS or isinstance(exc, TimeoutError)
            if not retry or now() + RETRY_S > deadline:
                reason = exc.strerror or str(exc)
                raise CollectiveError(f"cannot connect to {what} {fmt_addr(dst)} from "
                                      f"{fmt_addr(bind)}: {reason}") from None
        time.sleep(RETRY_S)


def listen(addr: tuple[str, int], backlog: int) -> socket.socket:
    """A non-blocking listener on ``addr``; a busy or foreign address ends the run."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise CollectiveError(f"cannot listen on {fmt_addr(addr)}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


def accept(listener: socket.socket, deadline: float, what: str
           ) -> tuple[socket.socket, tuple[str, int]]:
    """Accept one connection before ``deadline``; poll() so that SIGTERM still gets through."""
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    while True:
        left = deadline - now()
        if left <= 0:
            raise CollectiveError(f"no connection from {what} on "
                                  f"{fmt_addr(listener.getsockname())} in time")
        if poller.poll(left * 1000):
            try:
                sock, peer = listener.accept()
            except (BlockingIOError, ConnectionAbortedError):
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock, peer


# --------------------------------------------------------------------------------------------
# Connection records
# --------------------------------------------------------------------------------------------


def connection_record(epoch: int, sock: socket.socket, t_open: float) -> dict[str, Any]:
    """A connection's JSON entry as it opens: its 5-tuple, so the lab can match its counters."""
    src, dst = sock.getsockname(), sock.getpeername()
    return {"epoch": epoch, "src": src[0], "sport": src[1], "dst": dst[0], "dport": dst[1],
            "t_open": stamp(t_open)}


def wait_acked(sock: socket.socket, timeout_s: float = ACK_WAIT_S) -> None:
    """Give the last bytes a moment to be acknowledged, so bytes_acked/retransmits are final."""
    deadline = now() + timeout_s
    with contextlib.suppress(OSError):
        while tcp_u32(sock, UNACKED_OFFSET) or tcp_u32(sock, NOTSENT_OFFSET):
            if now() > deadline:
                return
            time.sleep(0.002)


def finish_connection(record: dict[str, Any], sock: socket.socket, graceful: bool) -> None:
    """Add TCP_INFO to a connection's record, read just before it is closed."""
    if graceful:
        wait_acked(sock)
    with contextlib.suppress(OSError):
        record.update(tcp_info(sock))
    record["t_close"] = stamp(now())


# --------------------------------------------------------------------------------------------
# A live view's step parts
# --------------------------------------------------------------------------------------------


#: A live file keeps this many of the rank's latest spans (a hundred steps of four parts):
#: enough for the live page's phase, bounded so a long job's rewrite stays small.
LIVE_SPANS = 400


class LiveParts:
    """A training rank's step parts as they happen, for a live view (the synthetic ring's
    and DDP's): each boundary a step crosses (its batch in hand, its compute done, its
    all-reduce done) closes one span and opens the next, and the file (``--live-file``) is
    rewritten whole when due.

    Why at boundaries and not from a timer: the main thread crosses them anyway, so the only
    cost is a clock read and a list append per part, plus a write at most every 0.5 s; a
    timer would be a thread of its own. A part still on is sent with no end (``None``) and
    the file's ``now``, so the page draws it up to then. Without a path nothing is kept.
    """

    def __init__(self, path: str | None, rank: int) -> None:
        self.file = LiveFile(path)
        self.rank = rank
        self.spans: deque[list[Any]] = deque(maxlen=LIVE_SPANS)
        self.open: tuple[str, float] | None = None

    def enter(self, part: str | None, t: float) -> None:
        """From ``t`` (this rank's clock) the rank is in ``part`` (None: between steps)."""
        if self.file.path is None:
            return
        if self.open is not None and t > self.open[1]:
            self.spans.append([self.open[0], stamp(self.open[1]), stamp(t)])
        self.open = None if part is None else (part, t)
        if self.file.due(t_now := now()):
            self.write(t_now)

    def write(self, t_now: float) -> None:
        """Rewrite the file: the spans kept, the one still on, and when this was said."""
        spans = list(self.spans)
        if self.open is not None:
            spans.append([self.open[0], stamp(self.open[1]), None])
        self.file.write({"rank": self.rank, "now": stamp(t_now), "spans": spans}, t_now)

    def finish(self) -> None:
        """The job's end: its last steps written, however soon after the last write."""
        if self.file.path is not None:
            self.write(now())
