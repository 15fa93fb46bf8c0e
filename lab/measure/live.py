"""What a live view shows of a running run: every sampled port's latest counters, the phase
and the run's last progress line. The samplers and the run write it; the live page's server
(``lab.report.live``) reads it.

Why one feed for the process, set while a run is watched (``publishing``): the samplers are
made by each kind, inside its own run, in threads of their own. A feed they look up at each
sample reaches every one of them without each kind handing it along, and without a live view
a sample costs one attribute read more. The rates are worked out only when the page asks
(about twice a second), not at every sample.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

#: A link's rate on the page is its bytes over (at least) this many seconds of samples.
RATE_WINDOW_S = 0.5
#: A port whose last sample is older than this has no rate (its sampler has stopped).
STALE_S = 1.5
#: One sampled port: (node, port number), as result.json's ``links`` and topology name it.
PortKey = tuple[str, int]


def port_id(node: str, port: int) -> str:
    """How the page names a port: ``leaf1:3``."""
    return f"{node}:{port}"


class Feed:
    """The latest counters of every sampled port, the phase and the last progress line.

    ``clock`` is where the run's and the phase's clocks and a sample's age are read from; it
    is the clock the samples are stamped with (``time.monotonic``).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self.clock = clock
        self.t0 = clock()
        #: Tells one run's feed from the next: a page left open reloads on a new one.
        self.run_id = secrets.token_hex(4)
        self._phase = "starting"
        self._phase_t = self.t0
        self._status = ""
        self._samples: dict[PortKey, deque[tuple[float, int]]] = {}

    def publish(self, now: float, tx_bytes: Mapping[PortKey, int]) -> None:
        """Bytes sent so far by some ports, read at ``now`` (on the feed's ``clock``)."""
        with self._lock:
            for key, sent in tx_bytes.items():
                q = self._samples.get(key)
                if q is None:
                    q = self._samples[key] = deque()
                q.append((now, sent))
                # Keep the newest sample that is at least RATE_WINDOW_S old, and all after it.
                while len(q) > 2 and now - q[1][0] >= RATE_WINDOW_S:
                    q.popleft()

    def set_phase(self, phase: str) -> None:
        with self._lock:
            self._phase, self._phase_t = phase, self.clock()

    def note(self, message: str) -> None:
        """The run's last progress line, as it printed it."""
        with self._lock:
            self._status = message.strip().splitlines()[0] if message.strip() else ""

    def state(self) -> dict[str, Any]:
        """What the page polls: run and phase clocks, phase, status, and each port's
        sending rate in bit/s over the last ``RATE_WINDOW_S`` (ports with no fresh samples
        are left out: their sampler is not running)."""
        now = self.clock()
        with self._lock:
            bps = {}
            for (node, port), q in self._samples.items():
                if len(q) < 2 or now - q[-1][0] > STALE_S:
                    continue
                (t_a, a), (t_b, b) = q[0], q[-1]
                if t_b > t_a:
                    bps[port_id(node, port)] = round(max(0, b - a) * 8 / (t_b - t_a))
            return {"run": self.run_id, "t": round(now - self.t0, 2), "phase": self._phase,
                    "phase_t": round(now - self._phase_t, 2), "status": self._status,
                    "wall": time.strftime("%H:%M:%S"), "bps": bps}


_current: Feed | None = None


def current() -> Feed | None:
    """The feed of the run being watched, or None (no live view)."""
    return _current


def set_phase(phase: str) -> None:
    """Tell the live view (if any) which phase the run is in."""
    feed = _current
    if feed is not None:
        feed.set_phase(phase)


@contextmanager
def publishing(feed: Feed) -> Iterator[Feed]:
    """Make ``feed`` the one the samplers and the run write to, for the body."""
    global _current
    _current = feed
    try:
        yield feed
    finally:
        _current = None
