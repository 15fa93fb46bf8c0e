"""The lab's own CPU share, as ``fidelity.lab_cpu_pct`` reports it, from real /proc readings."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from lab.measure import telemetry
from lab.model.result import validate


class Child:
    """A stand-in controller: a real process of the lab's, spinning or idle."""

    def __init__(self, code: str) -> None:
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-c", code])

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()


def sampled(controller: Child | None, busy_s: float) -> tuple[telemetry.Sampler, float]:
    """A sampler over ``busy_s`` of this process spinning; also the CPU % this process
    itself says it used meanwhile (os.times), to hold the sampler's figure against."""
    s = telemetry.Sampler([], hz=20.0, controller=controller)
    s.start()
    while not s.lab_cpu:
        time.sleep(0.01)
    t0, c0 = time.monotonic(), os.times()
    while time.monotonic() < t0 + busy_s:      # spinning: up to one core
        pass
    t1, c1 = time.monotonic(), os.times()
    s.stop()
    own = 100.0 * (c1.user + c1.system - c0.user - c0.system) / (t1 - t0)
    return s, own


def test_own_process_share_matches_os_times() -> None:
    s, own = sampled(None, 1.5)
    pct = s.lab_cpu_pct(0.0, s.lab_cpu[-1][0])
    assert pct is not None
    assert 0.0 < pct <= 100.0 * (os.cpu_count() or 1)
    # The same process measured two ways; the sampler's window is a sample period wider
    # on each side and counts in 10 ms ticks.
    assert abs(pct - own) < 20.0, (pct, own)


def test_controller_counts_too() -> None:
    spin = Child("while True: pass")
    try:
        time.sleep(0.3)
        s, own = sampled(spin, 1.5)
    finally:
        spin.stop()
    assert spin.proc is not None
    pct = s.lab_cpu_pct(0.0, s.lab_cpu[-1][0])
    first, last = s.lab_cpu[0][1], s.lab_cpu[-1][1]
    assert set(last) == {os.getpid(), spin.proc.pid}
    assert last[spin.proc.pid] > first[spin.proc.pid]     # the spinning child was counted
    assert pct is not None and own < pct <= 100.0 * (os.cpu_count() or 1), (pct, own)


def test_window_without_samples_is_none() -> None:
    s, _ = sampled(None, 0.2)
    assert s.lab_cpu_pct(100.0, 200.0) is None
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
    problems = [p for p in validate(result) if "lab_cpu_pct" in p]
    assert problems == []
