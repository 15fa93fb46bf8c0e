"""A live stream's two ends, run inside a host's namespace: ``send`` (the anchor) and ``play``.

``python -m lab.agents.streamer send`` pushes constant-bitrate media like an RTMP encoder: one frame
every ``1/fps`` s on a monotonic schedule (a late frame does not shift the ones after it), over
one TCP connection (frames back to back, length-prefixed) or as UDP datagrams. Its 5-tuple is
fixed on the command line (``--bind/--sport/--dst/--dport``) so the lab can install per-flow
counters for it before it starts.

``python -m lab.agents.streamer play`` is the other end (a media server's ingest, a CDN node, a
viewer): it records when each frame completely arrived and, when the stream ends, runs the
player model of :mod:`lab.agents.playout` over those arrivals. Doing the model after the
fact, on the recorded arrival times, gives exactly what a live player would have done (the
model is causal) without the measurement depending on how promptly this process was scheduled.

Both write a JSON summary (``--out``, default stdout) and stop cleanly on SIGTERM/SIGINT,
still writing what they have.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import selectors
import socket
import sys
import time
from pathlib import Path
from typing import Any

from lab.agents import golatch
from lab.agents import playout as streams
from lab.agents.common import (
    StopRequestedError,
    catch_signals,
    ignore_signals,
    tcp_info,
    write_json,
)
from lab.agents.workerbase import cpu_s

#: UDP socket buffers: big enough that the *link's* queue, not a socket, drops the datagrams.
UDP_SOCKET_BUFFER = 4 << 20
#: How often and how far apart a UDP sender repeats its end-of-stream marker: the first copies
#: queue behind a full bottleneck queue and may be dropped with the media.
UDP_END_REPEATS, UDP_END_GAP_S = 6, 0.1
#: Default TCP_NOTSENT_LOWAT: unsent bytes the socket may hold before a write blocks. Without
#: it the kernel buffers up to tcp_wmem's maximum (16 MiB here: minutes of media), so the
#: network's backpressure would never reach the sender, the blocked time would say nothing,
#: and the numbers would depend on a global sysctl that other runs may change.
DEFAULT_NOTSENT_LOWAT = 128 * 1024
#: A connect failing like this means the player is not listening yet: try again.
_RETRY_CONNECT = (errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH)


def _sleep_until_ns(deadline_ns: int) -> None:
    delay = deadline_ns - time.monotonic_ns()
    if delay > 0:
        time.sleep(delay / 1e9)


# --------------------------------------------------------------------------------------------
# Sender
# --------------------------------------------------------------------------------------------


class Sender:
    """Paces frames and accounts for how far the network held them back."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.count = max(1, round(args.duration * args.fps))
        self.sizes = streams.frame_sizes(args.rate_mbps * 1e6, args.fps, self.count)
        self.payload = bytes(max(self.sizes))
        self.period_ns = round(1e9 / args.fps)
        self.frames_sent = 0
        self.bytes_sent = 0
        self.datagrams_sent = 0
        self.send_drops = 0
        self.blocked_ns = 0
        self.max_lag_ns = 0
        self.frames_behind = 0
        self.drain_s: float | None = None
        self.tcp: dict[str, Any] | None = None
        self.stopped: str | None = None
        self.started_ns = 0
        self.t0_ns = 0
        self.elapsed_s = 0.0

    def _wait_for_go(self) -> None:
        """With ``--ready-file``: say the socket is ready, then wait for the lab's go, so
        that every stream of a phase starts together (:mod:`lab.agents.golatch`)."""
        a = self.args
        if not a.ready_file:
            return
        if not golatch.ready_then_wait(a.ready_file, a.go_timeout):
            raise StopRequestedError(f"no go within {a.go_timeout:g} s")

    def _tcp_socket(self) -> socket.socket:
        a = self.args
        deadline = time.monotonic() + a.connect_timeout
        while True:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # frames leave at once
            if a.cc:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, a.cc.encode())
            if a.sndbuf:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, a.sndbuf)
            if a.notsent_lowat > 0:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, a.notsent_lowat)
            sock.bind((a.bind, a.sport))
            try:
                sock.connect((a.dst, a.dport))
                return sock
            except OSError as exc:
                sock.close()
                if exc.errno not in _RETRY_CONNECT or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _send_all(self, sock: socket.socket, data: bytes) -> None:
        """Write all of ``data``; time spent waiting for room is the network holding us back."""
        view = memoryview(data)
        with selectors.DefaultSelector() as sel:
            sel.register(sock, selectors.EVENT_WRITE)
            while view:
                try:
                    view = view[sock.send(view):]
                except BlockingIOError:
                    t = time.monotonic_ns()
                    sel.select()
                    self.blocked_ns += time.monotonic_ns() - t

    def _pace(self, i: int) -> int:
        """Wait for frame i's slot; return its send timestamp (wall clock, for the player)."""
        due = self.t0_ns + i * self.period_ns
        _sleep_until_ns(due)
        lag = time.monotonic_ns() - due
        self.max_lag_ns = max(self.max_lag_ns, lag)
        if lag > self.period_ns:
            self.frames_behind += 1
        return time.time_ns()

    def run_tcp(self) -> None:
        a = self.args
        sock = self._tcp_socket()
        try:
            sock.setblocking(False)
            self._wait_for_go()
            self.t0_ns = time.monotonic_ns()
            self.started_ns = time.time_ns()
            for i, size in enumerate(self.sizes):
                now = self._pace(i)
                head = streams.pack_frame_header(a.stream_id, i, now, size, a.fps)
                self._send_all(sock, head + self.payload[:size])
                self.frames_sent += 1
                self.bytes_sent += size
            self._send_all(sock, streams.pack_frame_header(
                a.stream_id, self.frames_sent, time.time_ns(), 0, a.fps, end=True))
            self.elapsed_s = (time.monotonic_ns() - self.t0_ns) / 1e9
            self.tcp = _tcp_info(sock)
            # Half-close and wait for the player's EOF: then every byte has been delivered.
            sock.shutdown(socket.SHUT_WR)
            t = time.monotonic()
            with selectors.DefaultSelector() as sel:
                sel.register(sock, selectors.EVENT_READ)
                while sel.select(max(0.0, t + a.linger - time.monotonic())):
                    try:
                        if not sock.recv(4096):
                            self.drain_s = time.monotonic() - t
                            break
                    except (BlockingIOError, InterruptedError):
                        continue
                    except ConnectionError:
                        break
        finally:
            sock.close()

    def run_udp(self) -> None:
        a = self.args
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            _force_buffer(sock, socket.SO_SNDBUF, UDP_SOCKET_BUFFER)
            sock.bind((a.bind, a.sport))
            sock.setblocking(False)  # live media is never late on purpose: drop, count
            dst = (a.dst, a.dport)
            self._wait_for_go()
            self.t0_ns = time.monotonic_ns()
            self.started_ns = time.time_ns()
            for i, size in enumerate(self.sizes):
                now = self._pace(i)
                pieces = streams.fragment_sizes(size)
                off = 0
                for j, n in enumerate(pieces):
                    head = streams.pack_datagram_header(a.stream_id, i, now, size, a.fps,
                                                        j, len(pieces))
                    self._sendto(sock, head + self.payload[off:off + n], dst)
                    off += n
                self.frames_sent += 1
                self.bytes_sent += size
            self.elapsed_s = (time.monotonic_ns() - self.t0_ns) / 1e9
            for r in range(UDP_END_REPEATS):
                if r:
                    time.sleep(UDP_END_GAP_S)
                self._sendto(sock, streams.pack_datagram_header(
                    a.stream_id, self.frames_sent, time.time_ns(), 0, a.fps, 0, 0, end=True), dst)
        finally:
            sock.close()

    def _sendto(self, sock: socket.socket, data: bytes, dst: tuple[str, int]) -> None:
        try:
            sock.sendto(data, dst)
            self.datagrams_sent += 1
        except (BlockingIOError, ConnectionRefusedError):
            self.send_drops += 1
        except OSError as exc:
            if exc.errno not in (errno.ENOBUFS, errno.ECONNREFUSED):
                raise
            self.send_drops += 1

    def summary(self) -> dict[str, Any]:
        a = self.args
        return {
            "schema": streams.SUMMARY_SCHEMA, "tool": "send", "stream_id": a.stream_id,
            "proto": a.proto, "bind": a.bind, "sport": a.sport, "dst": a.dst, "dport": a.dport,
            "rate_bps": a.rate_mbps * 1e6, "fps": a.fps, "duration_s": a.duration,
            "frame_bytes": self.sizes[0], "frames_planned": self.count,
            "frames_sent": self.frames_sent, "bytes_sent": self.bytes_sent,
            "datagrams_sent": self.datagrams_sent, "send_drops": self.send_drops,
            "blocked_s": self.blocked_ns / 1e9, "max_lag_ms": self.max_lag_ns / 1e6,
            "frames_behind": self.frames_behind, "elapsed_s": self.elapsed_s,
            "drain_s": self.drain_s, "started_unix": self.started_ns / 1e9,
            # the first frame's time on the clock every namespace shares (None: never sent)
            "t0_monotonic": self.t0_ns / 1e9 if self.t0_ns else None,
            "stopped_by": self.stopped, "tcp": self.tcp,
        }


def _tcp_info(sock: socket.socket) -> dict[str, Any]:
    """What TCP itself says after the last write: congestion control, retransmits, RTT, and
    the send buffer settings that decide how much of the network's backpressure we feel."""
    info = tcp_info(sock)
    return {"cc": info["cc"], "total_retrans": info["retransmits"],
            "srtt_ms": info["rtt_us"] / 1e3, "snd_cwnd": info["snd_cwnd"],
            "sndbuf_bytes": sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
            "notsent_lowat": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT)}


def _force_buffer(sock: socket.socket, opt: int, size: int) -> None:
    """Set a socket buffer past the sysctl cap as root (SO_*BUFFORCE), else as far as allowed."""
    force = {socket.SO_SNDBUF: 32, socket.SO_RCVBUF: 33}[opt]  # SO_SNDBUFFORCE, SO_RCVBUFFORCE
    try:
        sock.setsockopt(socket.SOL_SOCKET, force, size)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, opt, size)


def cmd_send(args: argparse.Namespace) -> int:
    if args.ready_file:
        golatch.hold()
    sender = Sender(args)
    try:
        if args.proto == "tcp":
            sender.run_tcp()
        else:
            sender.run_udp()
    except StopRequestedError as exc:
        sender.stopped = str(exc)
        if sender.t0_ns:
            sender.elapsed_s = (time.monotonic_ns() - sender.t0_ns) / 1e9
    ignore_signals()  # a second SIGTERM must not cut the summary short
    write_json({**sender.summary(), "cpu_s": cpu_s()}, args.out)
    return 0


# --------------------------------------------------------------------------------------------
# Player
# --------------------------------------------------------------------------------------------


class Player:
    """Receives streams until enough have ended (or the time is up) and records arrivals."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.records: dict[int, streams.StreamRecord] = {}
        self.sel = selectors.DefaultSelector()
        self.buf = bytearray(1 << 18)
        self.conns: dict[socket.socket, tuple[streams.FrameParser, list[int]]] = {}
        self.stopped: str | None = None
        self.started_ns = time.time_ns()
        self.errors: list[str] = []

    def record(self, header: streams.Header) -> streams.StreamRecord:
        rec = self.records.get(header.stream_id)
        if rec is None:
            rec = self.records[header.stream_id] = streams.StreamRecord(header.stream_id,
                                                                        self.args.proto)
        return rec

    def listen(self) -> socket.socket:
        a = self.args
        if a.proto == "tcp":
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((a.bind, a.port))
            sock.listen(16)
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            _force_buffer(sock, socket.SO_RCVBUF, UDP_SOCKET_BUFFER)
            sock.bind((a.bind, a.port))
        sock.setblocking(False)
        return sock

    def ended(self) -> int:
        return sum(1 for r in self.records.values() if r.ended)

    def run(self) -> None:
        a = self.args
        lsock = self.listen()
        self.sel.register(lsock, selectors.EVENT_READ, "listen")
        if a.ready_file:
            Path(a.ready_file).write_text(f"{a.bind}:{a.port}\n")
        deadline = time.monotonic() + a.timeout
        try:
            self._loop(lsock, deadline)
        except StopRequestedError as exc:
            self.stopped = str(exc)
        finally:
            now = time.time_ns()
            for rec in self.records.values():
                rec.end(self.stopped or "timeout", now)
            for sock in list(self.conns):
                self._close(sock)
            self.sel.close()
            lsock.close()

    def _loop(self, lsock: socket.socket, deadline: float) -> None:
        a = self.args
        while self.ended() < a.streams:
            left = deadline - time.monotonic()
            if left <= 0:
                self.stopped = "timeout"
                return
            for key, _ in self.sel.select(min(left, 0.2)):
                if key.data == "listen" and a.proto == "tcp":
                    self._accept(lsock)
                elif key.data == "listen":
                    self._read_udp(lsock)
                else:
                    self._read_tcp(key.fileobj)  # type: ignore[arg-type]
            if a.proto == "udp":
                self._idle_check()

    def _accept(self, lsock: socket.socket) -> None:
        while True:
            try:
                conn, _ = lsock.accept()
            except BlockingIOError:
                return
            conn.setblocking(False)
            self.conns[conn] = (streams.FrameParser(), [])
            self.sel.register(conn, selectors.EVENT_READ, "conn")

    def _read_tcp(self, conn: socket.socket) -> None:
        parser, sids = self.conns[conn]
        while True:
            try:
                n = conn.recv_into(self.buf)
            except BlockingIOError:
                return
            except ConnectionError as exc:
                self._end_conn(conn, sids, f"reset: {exc}")
                return
            now = time.time_ns()
            if n == 0:
                self._end_conn(conn, sids, "partial-frame" if parser.partial else "eof")
                return
            try:
                headers = parser.feed(memoryview(self.buf)[:n], now)
            except ValueError as exc:
                self.errors.append(str(exc))
                self._end_conn(conn, sids, "bad-framing")
                return
            for h in headers:
                rec = self.record(h)
                if h.stream_id not in sids:
                    sids.append(h.stream_id)
                rec.add_frame(h, now)

    def _end_conn(self, conn: socket.socket, sids: list[int], reason: str) -> None:
        now = time.time_ns()
        for sid in sids:
            self.records[sid].end(reason, now)
        self._close(conn)

    def _close(self, conn: socket.socket) -> None:
        self.conns.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn)
        conn.close()

    def _read_udp(self, sock: socket.socket) -> None:
        while True:
            try:
                n = sock.recv_into(self.buf)
            except BlockingIOError:
                return
            now = time.time_ns()
            try:
                h, payload = streams.unpack_datagram(memoryview(self.buf)[:n])
            except ValueError as exc:
                self.errors.append(str(exc))
                continue
            rec = self.record(h)
            if rec.ended:
                continue
            rec.add_fragment(h, payload, now)
            if h.end:
                rec.end("end-marker", now)

    def _idle_check(self) -> None:
        now = time.time_ns()
        for rec in self.records.values():
            if not rec.ended and rec.last_ns is not None and \
                    now - rec.last_ns > self.args.idle_timeout * 1e9:
                rec.end("idle", rec.last_ns)

    def summary(self) -> dict[str, Any]:
        a = self.args
        per_stream = [rec.summarize(a.startup_ms, a.rebuffer_ms, a.fps)
                      for _, rec in sorted(self.records.items())]
        out: dict[str, Any] = {
            "schema": streams.SUMMARY_SCHEMA, "tool": "play", "proto": a.proto,
            "bind": a.bind, "port": a.port, "startup_ms": a.startup_ms,
            "rebuffer_ms": a.rebuffer_ms, "started_unix": self.started_ns / 1e9,
            "stopped_by": self.stopped, "errors": self.errors, "streams": per_stream,
        }
        out.update(streams.stream_totals(out))
        return out


def cmd_play(args: argparse.Namespace) -> int:
    player = Player(args)
    player.run()
    ignore_signals()  # a second SIGTERM must not cut the summary short
    write_json({**player.summary(), "cpu_s": cpu_s()}, args.out)
    return 0


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def _port(text: str) -> int:
    value = int(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"not a port: {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab.agents.streamer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("send", help="push a constant-bitrate stream (the anchor)")
    s.add_argument("--stream-id", type=int, default=1)
    s.add_argument("--proto", choices=("tcp", "udp"), default="tcp")
    s.add_argument("--bind", required=True, help="source IP")
    s.add_argument("--sport", type=_port, required=True, help="source port")
    s.add_argument("--dst", required=True, help="player IP")
    s.add_argument("--dport", type=_port, required=True, help="player port")
    s.add_argument("--rate-mbps", type=_positive(float), default=2.5,
                   help="media bitrate, Mbit/s (default 2.5; a big stream: 8-20)")
    s.add_argument("--fps", type=_positive(float), default=25.0, help="frames per second")
    s.add_argument("--duration", type=_positive(float), required=True, help="seconds")
    s.add_argument("--cc", help="TCP congestion control (cubic, reno, bbr)")
    s.add_argument("--sndbuf", type=int, default=0, help="TCP SO_SNDBUF bytes (0: kernel's)")
    s.add_argument("--notsent-lowat", type=int, default=DEFAULT_NOTSENT_LOWAT,
                   help="TCP_NOTSENT_LOWAT: writes block while this many bytes are unsent "
                        f"(default {DEFAULT_NOTSENT_LOWAT}; 0: the kernel's, unlimited)")
    s.add_argument("--connect-timeout", type=_positive(float), default=10.0,
                   help="keep retrying a refused connect this long (player not up yet)")
    s.add_argument("--linger", type=float, default=15.0,
                   help="after the last frame, wait this long for the player to confirm")
    s.add_argument("--ready-file", help="write this file once connected, then start the "
                   "stream only on SIGUSR1 (all of a phase's streams start together)")
    s.add_argument("--go-timeout", type=_positive(float), default=120.0,
                   help="with --ready-file: give up if no SIGUSR1 comes within this long")
    s.add_argument("--out", help="summary JSON file (default: stdout)")
    s.set_defaults(func=cmd_send)

    r = sub.add_parser("play", help="receive streams and model the viewer's player")
    r.add_argument("--proto", choices=("tcp", "udp"), default="tcp")
    r.add_argument("--bind", required=True, help="IP to listen on")
    r.add_argument("--port", type=_port, required=True)
    r.add_argument("--streams", type=_positive(int), default=1,
                   help="exit once this many streams have ended")
    r.add_argument("--startup-ms", type=float, default=1000.0,
                   help="media buffered before playback starts")
    r.add_argument("--rebuffer-ms", type=float, default=500.0,
                   help="media buffered again before playback resumes after a stall")
    r.add_argument("--fps", type=_positive(float), default=None,
                   help="playout frame rate (default: the rate the sender announces)")
    r.add_argument("--timeout", type=_positive(float), default=300.0,
                   help="give up after this many seconds in all")
    r.add_argument("--idle-timeout", type=_positive(float), default=3.0,
                   help="UDP: a stream silent this long has ended (its end marker was lost)")
    r.add_argument("--ready-file", help="written once the socket is listening")
    r.add_argument("--out", help="summary JSON file (default: stdout)")
    r.set_defaults(func=cmd_play)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    catch_signals()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
