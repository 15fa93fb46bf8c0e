"""A storage server and its clients: dataset reads and periodic checkpoint writes.

Why a program of its own and not iperf3: a training job's storage traffic has a shape - a
steady trickle of dataset reads into every GPU host, and every few seconds a checkpoint
that every host writes at once as fast as TCP allows. The steps that overlap a checkpoint
are the ones that slow down, so the lab needs each checkpoint's start and end on the same
clock as the workers' steps (``time.monotonic``, shared by every namespace), and fixed
source ports so the switches can count each connection.

``python -m lab.agents.storage serve --listen IP:PORT --out FILE``
``python -m lab.agents.storage client --server IP:PORT --bind IP --read-sport P --write-sport Q
--read-bps R --checkpoint-bytes C --every-s T --first-at-s D --duration-s X --out FILE
[--ready-file F]``

With ``--ready-file`` the client connects, says ready and starts its clock on the lab's go
(:mod:`lab.agents.golatch`): every GPU's checkpoints then start together, as a job's do. Started
one after another, eight clients' checkpoints were spread over a second and covered most
steps, so the steps "outside" a checkpoint were too few to compare.

The server also serves a training rank's input batches (:mod:`lab.agents.loader`): a
connection that opens with ``B`` asks for batches, each an 8-byte big-endian length answered
with that many bytes, so a batch's fetch time is a real request over the fabric. Each such
connection's sending side is recorded when it ends (``batch_conns``: the peer, and what TCP
says it sent, retransmissions included), since what crosses the wire towards a loader is
the server's to count, not the loader's.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import signal
import socket
import struct
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab.agents import golatch
from lab.agents.common import tcp_info

CHUNK = 64 * 1024
_BUF = bytes(CHUNK)
#: The first line of a connection that asks for batches (a loader worker's), and each batch
#: request on it: its length in bytes, big-endian, answered with that many bytes.
BATCH_HELLO = b"B\n"
BATCH_LENGTH = struct.Struct("!Q")
#: What a batch connection's record keeps of its TCP_INFO: payload bytes sent (a segment
#: sent again counts again), retransmitted, segments sent (each a frame on the wire), MSS.
BATCH_CONN_FIELDS = ("bytes_sent", "bytes_retrans", "segs_out", "retransmits", "snd_mss")
#: Seconds the server waits at its stop for connections still being recorded.
JOIN_S = 2.0


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def serve(listen: str, out: Path) -> int:
    """Accept clients until SIGTERM: ``R <bps>`` streams paced reads, ``W`` absorbs writes."""
    stop = threading.Event()
    totals: dict[str, Any] = {"read_bytes": 0, "written_bytes": 0, "connections": 0,
                              "batch_bytes": 0, "batches": 0, "batch_conns": []}
    lock = threading.Lock()
    threads: list[threading.Thread] = []

    def count_batch(nbytes: int) -> None:
        with lock:
            totals["batches"] += 1
            totals["batch_bytes"] += nbytes

    def handle(conn: socket.socket, peer: tuple[str, int]) -> None:
        with conn:
            head = b""
            while not head.endswith(b"\n"):
                b = conn.recv(1)
                if not b:
                    return
                head += b
            if head.startswith(b"R"):
                rate = float(head[1:].strip() or 0)
                t0, sent = time.monotonic(), 0
                while not stop.is_set():
                    due = (time.monotonic() - t0) * rate / 8
                    if sent >= due:
                        time.sleep(min(0.01, (sent - due) * 8 / max(rate, 1) + 0.001))
                        continue
                    try:
                        conn.sendall(_BUF[:8192])
                    except OSError:
                        break
                    sent += 8192
                with lock:
                    totals["read_bytes"] += sent
            elif head == BATCH_HELLO:
                _serve_batches(conn, stop, count_batch)
                # Its FIN first, so that every segment this side sends is in the count.
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_WR)
                info = tcp_info(conn)
                with lock:
                    totals["batch_conns"].append(
                        {"peer": peer[0], "port": peer[1],
                         **{k: info.get(k) for k in BATCH_CONN_FIELDS}})
            else:
                buf = bytearray(CHUNK)
                got = 0
                while True:
                    n = conn.recv_into(buf)
                    if not n:
                        break
                    got += n
                with lock:
                    totals["written_bytes"] += got

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(_addr(listen))
    srv.listen(64)
    srv.settimeout(0.2)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.is_set():
        try:
            conn, peer = srv.accept()
        except TimeoutError:
            continue
        totals["connections"] += 1
        threads.append(threading.Thread(target=handle, args=(conn, peer), daemon=True))
        threads[-1].start()
    # Connections their clients closed are being recorded: let them finish (a still open
    # one ends at the stop, at its next request).
    deadline = time.monotonic() + JOIN_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    with lock:
        out.write_text(json.dumps(totals))
    return 0


def _serve_batches(conn: socket.socket, stop: threading.Event,
                   count: Callable[[int], None]) -> None:
    """Answer each 8-byte big-endian length with that many bytes, until the client closes.

    One request at a time, as a dataset worker reads one sample file after another: the
    batch's fetch time is then a request's round trip plus its transfer, as on a real store.
    """
    head = bytearray(BATCH_LENGTH.size)
    while not stop.is_set():
        got = 0
        while got < BATCH_LENGTH.size:
            try:
                n = conn.recv_into(memoryview(head)[got:])
            except OSError:
                return
            if not n:
                return
            got += n
        (want,) = BATCH_LENGTH.unpack(head)
        left = want
        try:
            while left > 0:
                n = min(left, CHUNK)
                conn.sendall(_BUF[:n])
                left -= n
        except OSError:
            return
        count(want)


def _connect(server: str, bind: str, sport: int, timeout_s: float) -> socket.socket:
    deadline = time.monotonic() + timeout_s
    while True:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((bind, sport))
        try:
            s.connect(_addr(server))
            return s
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _wait_acked(sock: socket.socket, stop: threading.Event, poll_s: float = 0.002) -> None:
    """Until the server has acknowledged every byte written (SIOCOUTQ: unsent + unacked).

    ``sendall`` returns once the data is in the socket buffer - several MB with autotuning -
    so a checkpoint is only done when its last byte has reached the storage server.
    """
    while not stop.is_set():
        left = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ,
                                              b"\0\0\0\0"))[0]
        if left == 0:
            return
        time.sleep(poll_s)


def client(args: argparse.Namespace) -> int:
    """Read the dataset at ``read_bps`` and write a checkpoint every ``every_s`` seconds."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    result: dict[str, Any] = {"checkpoints": [], "read_bytes": 0, "error": None,
                              "clock": "monotonic", "t0": None}
    if args.ready_file:
        golatch.hold()
    try:
        reader = _connect(args.server, args.bind, args.read_sport, 10) \
            if args.read_bps > 0 else None
        writer = _connect(args.server, args.bind, args.write_sport, 10)
        writer.sendall(b"W\n")
        if reader is not None:
            reader.sendall(f"R {args.read_bps}\n".encode())
        if args.ready_file and not golatch.ready_then_wait(args.ready_file, args.go_timeout):
            raise TimeoutError(f"no go within {args.go_timeout:g} s")

        def read_loop() -> None:
            buf = bytearray(CHUNK)
            assert reader is not None
            reader.settimeout(0.2)
            while not stop.is_set():
                try:
                    n = reader.recv_into(buf)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not n:
                    return
                result["read_bytes"] += n

        if reader is not None:
            threading.Thread(target=read_loop, daemon=True).start()
        t0 = result["t0"] = time.monotonic()
        next_at = t0 + args.first_at_s
        end = t0 + args.duration_s
        while not stop.is_set() and time.monotonic() < end:
            if stop.wait(max(0.0, next_at - time.monotonic())):
                break
            if time.monotonic() >= end:
                break
            start, left = time.monotonic(), args.checkpoint_bytes
            while left > 0 and not stop.is_set():
                n = min(left, CHUNK)
                writer.sendall(_BUF[:n])
                left -= n
            _wait_acked(writer, stop)
            result["checkpoints"].append({"t_start": start, "t_end": time.monotonic(),
                                          "bytes": args.checkpoint_bytes - left})
            next_at += args.every_s
    except OSError as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        stop.set()
        Path(args.out).write_text(json.dumps(result))
    return 0 if result["error"] is None else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.agents.storage")
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--listen", required=True)
    s.add_argument("--out", required=True)
    c = sub.add_parser("client")
    c.add_argument("--server", required=True)
    c.add_argument("--bind", required=True)
    c.add_argument("--read-sport", type=int, required=True)
    c.add_argument("--write-sport", type=int, required=True)
    c.add_argument("--read-bps", type=float, default=0.0)
    c.add_argument("--checkpoint-bytes", type=int, required=True)
    c.add_argument("--every-s", type=float, required=True)
    c.add_argument("--first-at-s", type=float, default=1.0)
    c.add_argument("--duration-s", type=float, required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--ready-file", help="write this file once connected, then start only "
                   "on SIGUSR1 (every client's checkpoints start together)")
    c.add_argument("--go-timeout", type=float, default=120.0,
                   help="with --ready-file: give up if no SIGUSR1 comes within this long")
    args = p.parse_args(argv)
    if args.mode == "serve":
        return serve(args.listen, Path(args.out))
    return client(args)


if __name__ == "__main__":
    sys.exit(main())
