"""The lab's own CPU share, as ``fidelity.lab_cpu_pct`` reports it, from real /proc readings.

Every bound here holds on any machine under any load: a process's CPU counter only grows and
/proc/<pid>/stat reads the same counter as os.times() (both the kernel's utime + stime of the
thread group, in clock ticks), so a sampler's reading taken between two os.times() calls lies
between them. How many ticks a spin costs, or how much of a core it gets, is the machine's
and is not asserted. Waits on the sampler are hang guards, not bounds: it samples 20 times
a second.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

from lab.measure import telemetry
from lab.model.result import validate

HZ = telemetry.CLOCK_TICKS
#: CPU a spin uses before it counts as done: ticks of this process (or of the child).
SPIN_TICKS = 30
HANG_S = 60.0


def ticks(t: os.times_result) -> int:
    """This process's CPU from os.times() in clock ticks (times(2) counts in them too)."""
    return round(t.user * HZ) + round(t.system * HZ)


def wait_until(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + HANG_S
    while not cond():
        assert time.monotonic() < deadline, "hung"
        time.sleep(0.01)


def sample_after(s: telemetry.Sampler) -> None:
    """Until the sampler has read its counters after this call: a sample is read after the
    previous one is appended, so the second appended from now on was read from now on."""
    n = len(s.lab_cpu)
    wait_until(lambda: len(s.lab_cpu) >= n + 2)


def stopped(s: telemetry.Sampler) -> None:
    s.stop()
    s.join(HANG_S)
    assert not s.is_alive()


def recomputed(s: telemetry.Sampler) -> float:
    """The share from the sampler's first and last samples, by hand: every pid here lives
    through the whole window, so its ticks are its last reading less its first."""
    (t_a, a), (t_b, b) = s.lab_cpu[0], s.lab_cpu[-1]
    return round(100.0 * sum(b[pid] - a[pid] for pid in b) / HZ / (t_b - t_a), 1)


def test_own_process_share_is_bracketed_by_os_times() -> None:
    pid = os.getpid()
    w_before, before = time.monotonic(), ticks(os.times())
    s = telemetry.Sampler([], hz=20.0)
    s.start()
    wait_until(lambda: bool(s.lab_cpu))
    w0, c0 = time.monotonic(), ticks(os.times())
    while (c1 := ticks(os.times())) < c0 + SPIN_TICKS:     # spin for CPU, not for wall time
        pass
    w1 = time.monotonic()
    sample_after(s)
    stopped(s)
    after, w_after = ticks(os.times()), time.monotonic()
    readings = [r[pid] for _, r in s.lab_cpu]
    stamps = [s.t0 + t for t, _ in s.lab_cpu]
    # Sample 0 was read after `before` and before `c0`; the last ones after `c1`, before
    # `after`; the counter never goes back.
    assert before <= readings[0] <= c0
    assert readings == sorted(readings)
    assert c1 <= readings[-1] <= after
    pct = s.lab_cpu_pct(0.0, s.lab_cpu[-1][0])
    assert pct == recomputed(s)
    # So the share is between this process's own rates by os.times(): the sampler counted at
    # least the spin's ticks, at most all since `before`, over a window that holds [w0, w1]
    # (its first sample is stamped before w0, its last after w1) and lies in
    # [w_before, w_after].
    assert SPIN_TICKS <= c1 - c0 <= readings[-1] - readings[0] <= after - before
    assert w_before <= stamps[0] <= w0 and w1 <= stamps[-1] <= w_after


CHILD = """
import os, sys
hz = os.sysconf("SC_CLK_TCK")
said = -1
while True:                                       # spinning; says its CPU ticks as they grow
    t = os.times()
    ticks = round(t.user * hz) + round(t.system * hz)
    if ticks > said:
        sys.stdout.write(f"{ticks}\\n")
        sys.stdout.flush()
        said = ticks
"""


class Child:
    """A stand-in controller: a real process of the lab's, spinning."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-c", CHILD], stdout=subprocess.PIPE)

    def ticks_at_least(self, n: int) -> int:
        """Its CPU ticks, by its own account, once they reach ``n``."""
        assert self.proc is not None and self.proc.stdout is not None
        while (said := int(self.proc.stdout.readline())) < n:
            pass
        return said

    def stop(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()


def test_controller_counts_too() -> None:
    spin = Child()
    assert spin.proc is not None
    child = spin.proc.pid
    try:
        s = telemetry.Sampler([], hz=20.0, controller=spin)
        s.start()
        wait_until(lambda: bool(s.lab_cpu))
        first = s.lab_cpu[0][1][child]
        said = spin.ticks_at_least(first + SPIN_TICKS)
        sample_after(s)
        stopped(s)
    finally:
        spin.stop()
    last = s.lab_cpu[-1][1]
    assert set(last) == {os.getpid(), child}
    # The child said it had used `said` ticks before the last samples were read, so they
    # count at least that: the spinning child was counted.
    assert last[child] >= said >= first + SPIN_TICKS
    pct = s.lab_cpu_pct(0.0, s.lab_cpu[-1][0])
    assert pct == recomputed(s)
    # Its share alone, by the same samples, is part of the lab's (this process's is >= 0).
    span = s.lab_cpu[-1][0] - s.lab_cpu[0][0]
    assert pct is not None and pct >= round(100.0 * (last[child] - first) / HZ / span, 1)


def test_share_from_hand_made_samples() -> None:
    """The sum sample to sample: pid 1 (the lab) uses one core; pid 2 (a controller) dies
    after the first sample, so its last moments are not seen; pid 3 (its restart) counts
    from its start."""
    s = telemetry.Sampler([], hz=10.0)            # never started: its samples are these
    s.lab_cpu = [(0.0, {1: 0, 2: HZ // 10}),
                 (0.5, {1: HZ // 2, 3: HZ // 5}),
                 (1.0, {1: HZ, 3: 2 * HZ // 5})]
    assert s.lab_cpu_pct(0.0, 1.0) == 140.0       # (HZ + 2 HZ / 5) ticks over 1 s
    assert s.lab_cpu_pct(0.5, 1.0) == 140.0       # (HZ / 2 + HZ / 5) ticks over 0.5 s
    assert s.lab_cpu_pct(100.0, 200.0) is None    # no samples in the window
    assert s.lab_cpu_pct(0.0, 0.0) is None        # one sample is no window
    assert telemetry.worst_lab_cpu_pct([None, 3.5, 1.0]) == 3.5
    assert telemetry.worst_lab_cpu_pct([None]) is None


def test_schema_accepts_lab_cpu_pct() -> None:
    result = {
        "schema": 1, "scenario": "x", "policy": "p", "seed": 1, "duration_s": 1.0,
        "environment": {}, "topology": {"switches": [], "hosts": [], "links": []},
        "params": {}, "links": [], "flows": [], "metrics": {},
        "fidelity": {"cpu_idle_min_pct": 50.0, "lab_cpu_pct": 4.2, "valid": True,
                     "notes": []},
    }
    assert [p for p in validate(result) if "lab_cpu_pct" in p] == []
    for bad in ("4.2 %", -1.0, True):
        result["fidelity"]["lab_cpu_pct"] = bad
        assert [p for p in validate(result) if "lab_cpu_pct" in p] == \
            [f"fidelity.lab_cpu_pct is {bad!r}, expected a percentage (>= 0) or null"]
    result["fidelity"]["lab_cpu_pct"] = None     # not measured
    assert [p for p in validate(result) if "lab_cpu_pct" in p] == []
