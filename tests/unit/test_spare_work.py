"""Work burnt on purpose at idle priority counts as idle CPU when fidelity is judged.

The arithmetic is checked on given intervals; the whole is checked on a real spin: a child at
``SCHED_IDLE`` burns CPU while a real sampler reads /proc/stat, and counting the child's own
CPU (from the kernel, ``wait4``) as idle gives back at least what the child took from idle.
"""

from __future__ import annotations

import os
import time

import pytest

from lab.measure import telemetry
from lab.measure.telemetry import SpareWork, spare_cpu_s

HANG_S = 60.0


def test_spare_cpu_is_spread_over_its_interval() -> None:
    work = [SpareWork(0.0, 2.0, 1.0), SpareWork(3.0, 3.0, 0.25)]
    assert spare_cpu_s(work, 0.0, 1.0) == pytest.approx(0.5)
    assert spare_cpu_s(work, 1.5, 3.5) == pytest.approx(0.25 + 0.25)
    assert spare_cpu_s(work, 4.0, 5.0) == 0.0
    assert spare_cpu_s([], 0.0, 9.0) == 0.0


def spin_at_idle_priority(cpu_s: float) -> tuple[float, float, float]:
    """Fork a child that spins ``cpu_s`` of its own CPU at SCHED_IDLE; (start, end on the
    monotonic clock, the CPU the kernel says it used)."""
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            end = time.thread_time() + cpu_s
            while time.thread_time() < end and time.monotonic() < t0 + HANG_S:
                pass
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    _, status, usage = os.wait4(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return t0, time.monotonic(), usage.ru_utime + usage.ru_stime


def test_idle_priority_spin_counts_as_idle() -> None:
    s = telemetry.Sampler([], hz=20.0)
    s.start()
    deadline = time.monotonic() + HANG_S
    while not s.cpu:
        assert time.monotonic() < deadline, "the sampler never sampled"
        time.sleep(0.01)
    t0, t1, used = spin_at_idle_priority(1.5)
    time.sleep(0.2)
    s.stop()
    a, b = t0 - s.t0, t1 - s.t0
    spare = [SpareWork(a, b, used)]
    raw = s.cpu_idle_pct(a, b)
    given = s.cpu_idle_pct(a, b, spare=spare)
    assert raw and len(given) == len(raw)
    assert all(g >= r for g, r in zip(given, raw, strict=True)), (raw, given)
    # The spin's CPU, as a share of the machine's over the judged windows, is handed back
    # (capped at 100 % per window): at least part of it shows in the mean.
    assert sum(given) / len(given) > sum(raw) / len(raw), (raw, given, used)
    judged = s.judge(a, a, b, spare=spare)
    assert judged["spare_work"]["cpu_s"] == pytest.approx(used, rel=0.01)
    assert judged["spare_work"]["cpu_idle_min_pct_without"] == round(min(raw), 1)
    assert "spare_work" not in s.judge(a, a, b)
