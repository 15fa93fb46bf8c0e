"""What several agents do the same way: stop on a signal, write their JSON, read TCP_INFO.

Every agent is killed by the lab at the end of a phase or when a run is cut short, and the
lab still wants its numbers; so SIGTERM/SIGINT turn into :class:`StopRequestedError`, which
the agent catches to finish up, and a second signal is ignored while it writes its summary.
The summary goes to a file atomically, because the lab may read it the moment it appears.
TCP_INFO is read from one table of offsets, so that a retransmit or an RTT means the same
thing in every agent's output.

This runs inside hosts: standard library only, nothing of the lab.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import signal
import socket
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

#: The signals the lab stops an agent with; both end it cleanly, with its summary written.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: prctl(2) option: the signal a process gets when its parent dies.
_PR_SET_PDEATHSIG = 1


class StopRequestedError(Exception):
    """SIGTERM or SIGINT arrived: stop, write what we have. The message is the signal's name
    (``SIGTERM``), so a caller can turn it back into the signal for its exit status."""


def on_signal(signum: int, _frame: object) -> NoReturn:
    """Signal handler: raise in the main thread, wherever it is blocked or computing."""
    raise StopRequestedError(signal.Signals(signum).name)


def catch_signals() -> None:
    """From now on SIGTERM/SIGINT raise :class:`StopRequestedError` instead of killing us."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, on_signal)


def ignore_signals() -> None:
    """A second SIGTERM must not cut the clean-up or the summary short."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def write_json(data: dict[str, Any], out: str | None) -> None:
    """Write the summary to ``out`` (one space of indent), or to stdout when ``out`` is None.

    The file is written beside ``out`` and renamed over it, so readers never see half a
    file; stdout is flushed at once, so a reader of the pipe has it before we exit.
    """
    text = json.dumps(data, indent=1)
    if out:
        tmp = Path(out + ".tmp")
        tmp.write_text(text + "\n")
        tmp.replace(out)
    else:
        print(text, flush=True)


# --------------------------------------------------------------------------------------------
# TCP_INFO
# --------------------------------------------------------------------------------------------

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
#: Offsets of the u32 fields read on their own (:func:`tcp_u32`) while a connection runs.
TOTAL_RETRANS_OFFSET, UNACKED_OFFSET, NOTSENT_OFFSET = 100, 24, 144
#: Bytes asked for: more than any kernel's struct tcp_info so far (232 in 6.1, ~250 in 6.x).
TCP_INFO_LEN = 256


def tcp_info(sock: socket.socket) -> dict[str, Any]:
    """What TCP itself says about a connection: retransmits, bytes acked, RTT, cwnd, CE marks."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)
    info: dict[str, Any] = {}
    for name, fmt, offset in TCP_INFO_FIELDS:
        if offset + struct.calcsize(fmt) <= len(raw):
            info[name] = struct.unpack_from("=" + fmt, raw, offset)[0]
    info["cc"] = congestion_control(sock)
    return info


def tcp_u32(sock: socket.socket, offset: int) -> int:
    """One u32 field of TCP_INFO (0 if this kernel's struct is shorter): cheap enough per step."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)
    return struct.unpack_from("=I", raw, offset)[0] if offset + 4 <= len(raw) else 0


def congestion_control(sock: socket.socket) -> str:
    """The congestion control a socket really uses (the system's default unless set)."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
    return raw.split(b"\0", 1)[0].decode()


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (q in 0..100), linearly interpolated between order statistics
    (numpy's default); None if empty. The one percentile of the lab and its agents."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after ``(comm)``: [0] state, [1] ppid, [2] pgrp,
    [3] session, [11] utime, [12] stime, [13] cutime, [14] cstime (clock ticks). Readable
    until the process is reaped (a zombie included); None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2:].split()
    except (OSError, ValueError):
        return None


def process_cpu_ticks(pid: int, children: bool = False) -> int | None:
    """User+system CPU of a process (all its threads) in clock ticks; with ``children``,
    also that of the children it has reaped. None if it is gone."""
    fields = proc_stat(pid)
    if fields is None:
        return None
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks


def cpu_seconds(pid: int) -> float | None:
    """:func:`process_cpu_ticks` in seconds (None if the process is gone)."""
    ticks = process_cpu_ticks(pid)
    return None if ticks is None else ticks / os.sysconf("SC_CLK_TCK")


def positive_float(text: str) -> float:
    """An argparse type: a number > 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


# --------------------------------------------------------------------------------------------
# Viewers: their shared command line, and the state they report while they play
# --------------------------------------------------------------------------------------------

#: A viewer rewrites its live file at most this often (s): the live view polls twice a second.
LIVE_EVERY_S = 0.5


def add_viewer_arguments(p: argparse.ArgumentParser, *, url_help: str, ready_help: str,
                         epoch_help: str = "gives delay and live latency") -> None:
    """The options every viewer (``rtmpview``, ``hlsview``, ``hlsjsview``) takes alike, so
    that the lab starts each with the same words and they mean the same thing in all."""
    p.add_argument("--url", required=True, help=url_help)
    p.add_argument("--stream-id", type=int, default=1, help="the stream's id in the summary")
    p.add_argument("--duration", type=positive_float, required=True,
                   help="watch this many seconds from the viewer's own start")
    p.add_argument("--publish-epoch", type=float, default=None,
                   help=f"wall-clock time (unix s) the publisher sent PTS 0: {epoch_help}")
    p.add_argument("--ready-file", help=ready_help)
    p.add_argument("--out", help="summary JSON file (default: stdout)")
    p.add_argument("--live-file", default=None,
                   help="while watching, rewrite this JSON file (atomically, at most every "
                        f"{LIVE_EVERY_S:g} s) with the player's state so far, times in "
                        "CLOCK_MONOTONIC seconds (for a live view)")


def live_state(*, agent: str, stream_id: int, t0: float, now: float,
               startup_delay_s: float | None, stalls: Sequence[tuple[float, float | None]],
               ended_s: float | None = None, final: bool = False) -> dict[str, Any]:
    """What a viewer's live file says: its player's state at ``now`` and how it got there.

    ``t0`` and ``now`` are ``time.monotonic()`` readings; the other times are seconds since
    ``t0`` as the player model gives them (``startup_delay_s`` None: no picture yet; a stall's
    end None: still stalled, one ending at ``now``: stalled until the viewer left;
    ``ended_s``: the stream ended and playback with it). They are
    written as monotonic seconds: CLOCK_MONOTONIC is one clock for every network namespace
    of a kernel, so the lab reads them on its own clock without converting. Whatever the
    model puts after ``now`` is cut at ``now``: a live file says only what has happened.
    """
    rel = now - t0
    first = t0 + startup_delay_s if startup_delay_s is not None and startup_delay_s <= rel \
        else None
    spans = [(t0 + a, None if b is None or b > rel else t0 + b) for a, b in stalls if a <= rel]
    if first is None:
        state = "waiting"
    elif spans and (spans[-1][1] is None or spans[-1][1] >= now):
        state = "stalled"
    elif ended_s is not None and ended_s <= rel:
        state = "ended"
    else:
        state = "playing"
    return {"agent": agent, "stream_id": stream_id, "clock": "CLOCK_MONOTONIC",
            "join": round(t0, 4), "now": round(now, 4), "state": state,
            "first_picture": None if first is None else round(first, 4),
            "stalls": [[round(a, 4), None if b is None else round(b, 4)] for a, b in spans],
            "stall_count": len(spans),
            "ended": round(t0 + ended_s, 4) if state == "ended" and ended_s is not None
            else None, "final": final}


class LiveFile:
    """A viewer's live file: rewritten whole (:func:`write_json`: beside it, then renamed, so
    a reader never sees half of one), at most every ``every_s`` seconds. A viewer asks
    :meth:`due` from its loop and computes its state only then, so a viewer without
    ``--live-file`` (``path`` None) does no work for it at all."""

    def __init__(self, path: str | None, every_s: float = LIVE_EVERY_S) -> None:
        self.path = path
        self.every_s = every_s
        self.next_at = 0.0
        self.writes = self.failures = 0

    def due(self, now: float) -> bool:
        return self.path is not None and now >= self.next_at

    def wait_s(self, now: float, longest: float) -> float:
        """How long a loop may block before its next write is due (``longest`` without a
        live file)."""
        if self.path is None:
            return longest
        return max(0.0, min(longest, self.next_at - now))

    def write(self, state: dict[str, Any], now: float) -> None:
        """Write ``state``. A write that fails (the directory gone) is counted, not raised:
        the live file is for a live view, and must not end the watch its summary is for."""
        if self.path is None:
            return
        self.next_at = now + self.every_s
        try:
            write_json(state, self.path)
            self.writes += 1
        except OSError:
            self.failures += 1


def pdeathsig_setter() -> Callable[[int], None]:
    """What a child of an agent calls between fork and its work (or exec), with its parent's
    PID: the kernel then SIGKILLs it when the parent dies, and it exits at once if the parent
    already has (it died before the call). So not even a SIGKILLed agent leaves a child
    behind. ``prctl`` is looked up here, in the parent before the fork: a child forked from
    a threaded process should not load anything before it execs."""
    try:
        prctl: Any = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None

    def die_with(parent: int) -> None:
        if prctl is None:
            return
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
    return die_with
