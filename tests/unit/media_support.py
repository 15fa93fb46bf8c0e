"""What the real-media unit tests share: an nginx-rtmp server of the lab's own configuration
(``lab.kinds.streaming.media.Server``) on free loopback ports, waiting for a condition, and
reading a viewer's live file (``--live-file``) while it plays."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from lab.agents.common import LIVE_EVERY_S
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


def collect_live(path: Path, proc: subprocess.Popen[bytes], timeout: float,
                 kill: tuple[subprocess.Popen[bytes], float] | None = None,
                 ) -> list[dict[str, Any]]:
    """Every distinct state a viewer's live file held, read every 50 ms until ``proc``
    (a ``subprocess.Popen``) exits; each read must be a whole JSON document. ``kill``: a
    publisher and a ``time.monotonic()`` moment, when it is SIGKILLed (by PID) while the
    viewer watches."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if kill is not None and time.monotonic() >= kill[1]:
            kill[0].kill()
            kill = None
        done = proc.poll() is not None
        if path.exists():
            doc = json.loads(path.read_text())
            if not seen or doc != seen[-1]:
                seen.append(doc)
        if done:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"the viewer did not end within {timeout} s")


def check_live_against_summary(seen: list[dict[str, Any]], stream: dict[str, Any],
                               t_start: float, t_end: float) -> None:
    """A viewer's live states against its summary: times on the caller's monotonic clock,
    at most about one write per ``LIVE_EVERY_S``, the states in the order a player goes
    through them, and the final write the summary's own stalls."""
    assert seen, "no live file was written"
    nows = [d["now"] for d in seen]
    assert nows == sorted(nows) and t_start <= seen[0]["join"] <= nows[0] <= nows[-1] <= t_end
    live_writes = [d for d in seen if not d["final"]]
    gaps = [b["now"] - a["now"] for a, b in itertools.pairwise(live_writes)]
    assert all(g >= LIVE_EVERY_S - 0.01 for g in gaps), gaps
    states = [d["state"] for d in seen]
    assert states[0] == "waiting" and "playing" in states
    assert states.index("playing") < len(states) - 1 - states[::-1].index("stalled")
    final = seen[-1]
    assert final["final"] and final["stall_count"] == stream["stalls"]
    want = [[final["join"] + e["start_s"], final["join"] + e["start_s"] + e["duration_s"]]
            for e in stream["stall_events"]]
    assert [x for pair in final["stalls"] for x in pair] == \
        pytest.approx([x for pair in want for x in pair], abs=1e-3), (final, want)
    assert final["first_picture"] == pytest.approx(final["join"] + stream["startup_delay_s"],
                                                   abs=1e-3)
