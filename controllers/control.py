"""The lab's control channel: JSON lines over a unix socket, one reply line per request.

A unix socket rather than TCP so that nothing but local root (mode 0600) can reprogram
the fabric, and nothing is exposed on any network. The server is runtime-agnostic: it is
given a ``spawn`` (the runtime's ``hub.spawn``) and a handler, and uses the plain
``socket`` module, which is green after Ryu's ``hub.patch()`` and a real thread-blocking
socket under os-ken's native hub; both are fine because every connection gets its own
spawned thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
from collections.abc import Callable
from typing import Any

LOG = logging.getLogger("fabriclab.control")

#: A watch request for every flow of a large scenario fits; anything bigger is a bug.
MAX_LINE = 16 * 1024 * 1024
ACCEPT_POLL_S = 0.5           # how often a blocked accept() checks that we are stopping

Handler = Callable[[dict[str, Any]], dict[str, Any]]


def decode(line: bytes) -> dict[str, Any]:
    """One request line; ``ValueError`` with a message fit for the error reply."""
    try:
        msg = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"bad JSON: {exc}") from None
    if not isinstance(msg, dict):
        raise ValueError("bad request: expected a JSON object")
    return msg


def encode(reply: dict[str, Any]) -> bytes:
    return json.dumps(reply, separators=(",", ":")).encode() + b"\n"


class ControlServer:
    """Accepts connections on ``path`` and answers each request line with ``handler``."""

    def __init__(self, path: str, handler: Handler, spawn: Callable[..., Any]) -> None:
        self.path = path
        self.handler = handler
        self.spawn = spawn
        self._stopping = False
        self._sock: socket.socket | None = None

    def start(self) -> None:
        """Bind now (so a bad path fails the start-up), serve in a spawned thread."""
        with contextlib.suppress(FileNotFoundError):
            mode = os.lstat(self.path).st_mode
            if not stat.S_ISSOCK(mode):
                raise OSError(f"control_socket: {self.path} exists and is not a socket")
            os.unlink(self.path)               # stale: a previous controller's
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)            # never world-connectable, not even briefly
        try:
            sock.bind(self.path)
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        sock.listen(16)
        sock.settimeout(ACCEPT_POLL_S)
        self._sock = sock
        self.spawn(self._serve)
        LOG.info("control socket %s", self.path)

    def stop(self) -> None:
        self._stopping = True
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stopping:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopping:
                    return
                LOG.exception("control socket accept failed")
                continue
            conn.settimeout(None)
            self.spawn(self._connection, conn)

    def _connection(self, conn: socket.socket) -> None:
        with conn:
            buf = b""
            while not self._stopping:
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip() and not self._send(conn, self.answer(line)):
                        return
                if len(buf) > MAX_LINE:
                    self._send(conn, {"ok": False, "error": "request line too long"})
                    return

    @staticmethod
    def _send(conn: socket.socket, reply: dict[str, Any]) -> bool:
        try:
            conn.sendall(encode(reply))
        except OSError:
            return False                       # the client went away; nothing to tell it
        return True

    def answer(self, line: bytes) -> dict[str, Any]:
        """The reply to one request line; never raises (a bug is an error reply + a log)."""
        try:
            return self.handler(decode(line))
        except ValueError as exc:
            return {"ok": False, "error": str(exc)}
        except Exception as exc:                # the server must keep serving
            LOG.exception("control request failed")
            return {"ok": False, "error": f"internal error: {type(exc).__name__}: {exc}"}
