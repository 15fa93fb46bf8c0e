"""What a live view shows of a running run: every sampled port's latest counters, the phase
and the run's last progress line, and the lanes of the phase (what each of some actors, e.g.
a streaming kind's viewers, has been doing since the phase began). The samplers and the run
write it; the live page's server (``lab.report.live``) reads it.

Why one feed for the process, set while a run is watched (``publishing``): the samplers are
made by each kind, inside its own run, in threads of their own. A feed they look up at each
sample reaches every one of them without each kind handing it along, and without a live view
a sample costs one attribute read more. The rates are worked out only when the page asks
(about twice a second), not at every sample.

Lanes are kind-agnostic: a lane is a row of spans of named states (``playing``, ``stalled``…)
on the feed's clock, and whoever knows them (a kind's poller) replaces all of them at once
with :meth:`Feed.set_lanes`. They belong to a phase: a new phase clears them, while a step of
the same phase (``incident: draining``) keeps them, so the page still shows how the phase
ended while its counters are read. Their times go out as seconds since the phase began,
the clock the page draws the uplinks' history on.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
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


#: One span of a lane: (state, start, end), times on the feed's clock; end None: still on.
Span = tuple[str, float, float | None]


@dataclass(frozen=True)
class Lane:
    """One row of the live figure: what one actor did when, as spans of named states.

    ``asof`` (the feed's clock) is when its source last said so: a span still on is drawn
    up to it, not to now, so that a source that fell silent is not shown as still doing
    what it last said.
    """

    id: str
    label: str
    spans: tuple[Span, ...]
    asof: float


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
        #: The phase without its step, when it began, and how many phases there were.
        self._phase_name, self._phase_start, self._phase_seq = self._phase, self.t0, 0
        self._lanes: tuple[Lane, ...] = ()
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

    def set_phase(self, phase: str, step: str = "") -> None:
        """The run is in ``phase`` (at ``step`` of it, e.g. ``draining``). A new phase
        restarts the phase clock the lanes are drawn on and clears them; a new step of the
        same phase does neither."""
        with self._lock:
            now = self.clock()
            self._phase = f"{phase}: {step}" if step else phase
            self._phase_t = now
            if phase != self._phase_name:
                self._phase_name, self._phase_start = phase, now
                self._phase_seq += 1
                self._lanes = ()

    def set_lanes(self, lanes: Iterable[Lane]) -> None:
        """Replace the phase's lanes (all of them: a poller says everything it knows)."""
        with self._lock:
            self._lanes = tuple(lanes)

    def note(self, message: str) -> None:
        """The run's last progress line, as it printed it."""
        with self._lock:
            self._status = message.strip().splitlines()[0] if message.strip() else ""

    def state(self) -> dict[str, Any]:
        """What the page polls: run and phase clocks, phase, status, and each port's
        sending rate in bit/s over the last ``RATE_WINDOW_S`` (ports with no fresh samples
        are left out: their sampler is not running); the phase's own clock (``lane_t``,
        since the phase began, steps included), its number (``phase_seq``) and its lanes,
        their times on that clock."""
        now = self.clock()
        with self._lock:
            bps = {}
            for (node, port), q in self._samples.items():
                if len(q) < 2 or now - q[-1][0] > STALE_S:
                    continue
                (t_a, a), (t_b, b) = q[0], q[-1]
                if t_b > t_a:
                    bps[port_id(node, port)] = round(max(0, b - a) * 8 / (t_b - t_a))
            t0 = self._phase_start

            def rel(t: float | None) -> float | None:
                return None if t is None else round(t - t0, 3)

            lanes = [{"id": ln.id, "label": ln.label, "asof": rel(ln.asof),
                      "spans": [[state, rel(a), rel(b)] for state, a, b in ln.spans]}
                     for ln in self._lanes]
            return {"run": self.run_id, "t": round(now - self.t0, 2), "phase": self._phase,
                    "phase_t": round(now - self._phase_t, 2), "status": self._status,
                    "wall": time.strftime("%H:%M:%S"), "bps": bps,
                    "phase_seq": self._phase_seq, "lane_t": round(now - t0, 3),
                    "lanes": lanes}


_current: Feed | None = None


def current() -> Feed | None:
    """The feed of the run being watched, or None (no live view)."""
    return _current


def set_phase(phase: str, step: str = "") -> None:
    """Tell the live view (if any) which phase the run is in, and at which step of it."""
    feed = _current
    if feed is not None:
        feed.set_phase(phase, step)


@contextmanager
def publishing(feed: Feed) -> Iterator[Feed]:
    """Make ``feed`` the one the samplers and the run write to, for the body."""
    global _current
    _current = feed
    try:
        yield feed
    finally:
        _current = None


#: How often lanes are read from the files their programs write (s): the page polls every
#: 0.5 s, and a program rewrites its file at most that often.
LANE_POLL_S = 0.5


class LanePoller:
    """A thread that calls ``read`` every ``LANE_POLL_S`` and publishes the lanes it returns
    to ``feed``; :meth:`stop` reads them one last time, after the programs' final write
    (made as they exit, so before the phase's wait for them returns)."""

    def __init__(self, feed: Feed, read: Callable[[], list[Lane]]) -> None:
        self.feed, self.read = feed, read
        self._stop = threading.Event()
        self.polls = 0
        self._thread = threading.Thread(target=self._run, name="fabriclab-lanes", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def poll(self) -> None:
        self.feed.set_lanes(self.read())
        self.polls += 1

    def _run(self) -> None:
        while not self._stop.wait(LANE_POLL_S):
            self.poll()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.poll()


@contextmanager
def polling_lanes(read: Callable[[], list[Lane]]) -> Iterator[None]:
    """For the body (a phase's wait for its programs), publish the lanes ``read`` returns
    to the live feed, if there is one; without a live view nothing runs."""
    feed = _current
    if feed is None:
        yield
        return
    poller = LanePoller(feed, read)
    poller.start()
    try:
        yield
    finally:
        poller.stop()
