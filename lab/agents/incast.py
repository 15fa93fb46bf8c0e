"""The synchronised many-to-one phase of collectives: ``python -m lab.agents.worker
incast-sink`` and ``incast-send``.

M senders answer one "go" from the sink at the same instant and the sink's step ends with
the last byte, so the step time is set by how the switch port in front of the sink copes with
M bursts at once. The JSON these write is described in :mod:`lab.agents.worker`.

This runs inside hosts: standard library only, nothing of the lab.
"""

from __future__ import annotations

import argparse
import select
import socket
import struct
import time
from typing import Any

from lab.agents.common import congestion_control
from lab.agents.workerbase import (
    LOWAT_BYTES,
    CollectiveError,
    accept,
    connect,
    connection_record,
    cpu_s,
    finish_connection,
    fmt_addr,
    listen,
    now,
    stamp,
)

#: The incast sink tells each sender the burst size in this header, right after accepting it.
INCAST_HELLO = struct.Struct("!Q")
#: The sink's per-step "go" byte.
GO = b"g"


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
        """Accept every sender and tell it the burst size, so senders need no --burst."""
        a = self.args
        self.listener = listen(a.listen, backlog=max(16, a.senders))
        deadline = now() + a.connect_timeout_s
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
        """Accept all senders, then ``--steps`` times: a compute gap, a go, every burst in."""
        a = self.args
        self._accept_all()
        self.t_ready = now()
        for step in range(a.steps):
            time.sleep(a.gap_s)  # the "compute" between two synchronised phases
            self.steps.append(self._step(step))

    def _step(self, step: int) -> dict[str, Any]:
        """One synchronised phase: go to every sender at once, done when the last byte is in."""
        a = self.args
        t_start = now()
        for i, sock in enumerate(self.conns):
            try:
                sock.send(GO)  # 1 byte into an empty buffer: never blocks
            except OSError as exc:
                raise CollectiveError(f"sender {fmt_addr(self.peers[i])}: {exc.strerror}") from None
        done = self._collect(step)
        t_end = max(done)
        step_s = t_end - t_start
        return {"step": step, "t_start": stamp(t_start), "t_end": stamp(t_end),
                "step_s": stamp(step_s),
                "per_sender_s": [stamp(t - t_start) for t in done],
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
                slow = [fmt_addr(self.peers[i]) for i, n in enumerate(left) if n]
                raise CollectiveError(f"step {step}: nothing from {', '.join(slow)} "
                                      f"for {a.io_timeout_s:g} s")
            for fd, _events in ready:
                i = index[fd]
                left[i] -= self._drain(i, left[i])
                if left[i] == 0:
                    done[i] = now()
                    poller.unregister(fd)
                    pending -= 1
                else:
                    self.conns[i].setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT,
                                             min(LOWAT_BYTES, left[i]))
        return done

    def _drain(self, i: int, left: int) -> int:
        """Read what sender ``i`` has delivered (its bytes are counted, not kept)."""
        sock, done = self.conns[i], 0
        while done < left:
            want = min(left - done, len(self.scratch))
            try:
                n = sock.recv_into(self.scratch[:want])
            except BlockingIOError:
                break
            except OSError as exc:
                raise CollectiveError(f"sender {fmt_addr(self.peers[i])}: {exc.strerror}") from None
            if n == 0:
                raise CollectiveError(f"sender {fmt_addr(self.peers[i])} closed the connection")
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
            "mode": "incast", "role": "sink", "listen": fmt_addr(a.listen), "senders": a.senders,
            "burst_bytes": a.burst, "gap_s": a.gap_s, "steps_requested": a.steps,
            "clock": "monotonic", "t_ready": None if self.t_ready is None else stamp(self.t_ready),
            "sender_addrs": [{"src": p[0], "sport": p[1]} for p in self.peers],
            "steps": self.steps, "cpu_s": cpu_s(), "error": error,
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
        """Connect, learn the burst size, then answer every go until the sink closes."""
        a = self.args
        t_open = now()
        self.sock = connect((a.bind, a.sport), a.connect, a.cc,
                            now() + a.connect_timeout_s, "incast sink")
        self.conn = connection_record(0, self.sock, t_open)
        self.cc = congestion_control(self.sock)
        self.sock.settimeout(a.io_timeout_s)
        try:
            self.burst = INCAST_HELLO.unpack(self._recv_exact(INCAST_HELLO.size))[0]
            payload = memoryview(bytearray(self.burst))
            while self._recv_exact(1, eof_ok=True):
                t_go = now()
                self.sock.sendall(payload)
                self.steps.append({"step": len(self.steps), "t_go": stamp(t_go),
                                   "t_written": stamp(now())})
        except TimeoutError:
            raise CollectiveError(f"nothing from the sink for {a.io_timeout_s:g} s") from None
        except ConnectionError as exc:
            raise CollectiveError(f"incast sink {fmt_addr(a.connect)}: {exc.strerror}") from None
        self._close(graceful=True)

    def _recv_exact(self, n: int, eof_ok: bool = False) -> bytes:
        """``n`` bytes from the sink; with ``eof_ok`` a clean EOF first means the run is over."""
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
        """Record the connection's TCP_INFO (after its last ACKs when ``graceful``), close it."""
        if self.sock is None:
            return
        if self.conn is not None:
            finish_connection(self.conn, self.sock, graceful)
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
            "connections": self.connections, "cpu_s": cpu_s(), "error": error,
        }
