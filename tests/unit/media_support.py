"""What the real-media unit tests share: an nginx-rtmp server of the lab's own configuration
(``lab.kinds.streaming.media.Server``) on free loopback ports, and waiting for a condition."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lab.kinds.streaming import media


def until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.02)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def nginx(root: Path, role: str) -> Iterator[media.Server]:
    """The lab's nginx-rtmp ``role`` server on 127.0.0.1, free ports, in ``root``; stopped by
    its PID afterwards."""
    srv = media.Server("test", "127.0.0.1", role, root, {}, rtmp_port=free_port(),
                       http_port=free_port())
    for sub in ("tmp", "hls"):
        (root / sub).mkdir(exist_ok=True)
    (root / "nginx.conf").write_text(srv.conf())
    srv.proc = subprocess.Popen(srv.argv(), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def listening() -> bool:
            assert srv.proc.poll() is None, (root / "error.log").read_text()
            with socket.socket() as s:
                port = srv.http_port if role == "cdn" else srv.rtmp_port
                return s.connect_ex(("127.0.0.1", port)) == 0
        until(listening, 5, "nginx listening")
        yield srv
    finally:
        media.stop([srv.proc])
