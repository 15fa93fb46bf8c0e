"""The datapath's waiting, read from the kernel's scheduler statistics, and the one verdict.

The waiting is measured on real threads: a process standing in for the datapath shares one
CPU with two spinners, so it is runnable and waiting for about two thirds of every second;
the bound asserted (a fifth) holds however the scheduler slices, and needs no root.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.measure import headroom, telemetry

SPIN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"


def spinner(seconds: float, cpu: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SPIN.format(s=seconds)],
                            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))


def test_a_datapath_sharing_its_cpu_waits_and_the_sampler_says_how_long(tmp_path: Path) -> None:
    cpu = min(os.sched_getaffinity(0))
    procs = [spinner(3.5, cpu) for _ in range(3)]
    pidfile = tmp_path / "dp.pid"
    pidfile.write_text(f"{procs[0].pid}\n")
    s = telemetry.Sampler([], hz=10.0)
    s.dp = headroom.DatapathThreads(str(pidfile))
    s.dp.softirqd = []                      # only the stand-in's own waiting
    s.start()
    time.sleep(3.0)
    s.stop()
    for p in procs:
        p.wait()
    got = s.datapath_numbers(0.0, 3.0)
    assert len(got["datapath_wait_ms"]) >= 2, got
    # Runnable all the time on a CPU shared three ways: it waits ~667 ms of each second.
    assert min(got["datapath_wait_ms"]) > 200, got
    assert got["datapath_wait_max_ms"] == max(got["datapath_wait_ms"])
    assert all(0 <= x <= 100 for x in got["softirq_pct"]), got


def test_a_missing_datapath_waits_for_nothing(tmp_path: Path) -> None:
    dp = headroom.DatapathThreads(str(tmp_path / "absent.pid"))
    assert dp.vswitchd is None
    dp.softirqd = []
    assert dp.wait_ns() == 0


def test_the_softirq_threads_are_the_kernels_own() -> None:
    """Kernel threads named ksoftirqd/N, children of kthreadd: one per CPU on Linux."""
    found = headroom._kernel_threads("ksoftirqd/")
    assert len(found) >= 1
    for pid in found:
        assert Path(f"/proc/{pid}/comm").read_text().startswith("ksoftirqd/")


@pytest.mark.parametrize(("idle", "bound"), [(headroom.MIN_CPU_IDLE_PCT, False),
                                            (headroom.MIN_CPU_IDLE_PCT - 0.1, True),
                                            (100.0, False), (0.0, True)])
def test_without_the_datapaths_waiting_the_verdict_is_the_idle_line(idle: float,
                                                                     bound: bool) -> None:
    why = headroom.cpu_verdict({"cpu_idle_min_pct": idle, "datapath_wait_ms": []})
    assert (why is not None) is bound
    if bound:
        assert f"{idle:.0f}% idle" in why


@pytest.mark.parametrize(("waits", "bound"), [([20.0, headroom.MAX_DATAPATH_WAIT_MS], False),
                                              ([20.0, headroom.MAX_DATAPATH_WAIT_MS + 1], True)])
def test_the_datapaths_worst_second_decides_whatever_the_idle(waits: list[float],
                                                              bound: bool) -> None:
    """A machine whose idle went to the lab's own programs is valid while the datapath got
    its CPU; one with CPU to spare is not if the datapath waited anyway."""
    for idle in (5.0, 90.0):
        why = headroom.cpu_verdict({"cpu_idle_min_pct": idle, "datapath_wait_ms": waits,
                                    "datapath_wait_max_ms": max(waits)})
        assert (why is not None) is bound, (idle, why)
        if bound:
            assert f"waited {max(waits):.0f} ms" in why


def test_a_result_keeps_the_datapath_and_class_numbers_only() -> None:
    judged = {"cpu_idle_min_pct": 40.0, "datapath_wait_ms": [1.0], "datapath_wait_max_ms": 1.0,
              "datapath_wait_asleep_ms": 0.0, "softirq_pct": [2.0], "softirq_max_pct": 2.0,
              "window_s": [0, 1],
              "cpu_classes": {"traffic": {"cpu_pct": 3.0, "wait_pct": 0.5}}}
    assert set(headroom.cpu_fields(judged)) == set(headroom.CPU_FIELDS)


def test_a_class_is_starved_by_its_programs_average_wait_not_their_sum() -> None:
    """128 senders that each wait 30 ms a second are not starved; 2 that wait 500 ms are."""
    many = {"cpu_classes": {"traffic": {"cpu_pct": 12.0, "wait_pct": 384.0, "programs": 128}}}
    few = {"cpu_classes": {"traffic": {"cpu_pct": 12.0, "wait_pct": 100.0, "programs": 2}}}
    other = {"cpu_classes": {"browser": {"cpu_pct": 90.0, "wait_pct": 100.0, "programs": 1}}}
    assert headroom.starved_notes(many) == []
    assert headroom.starved_notes(other) == []      # a browser waiting changes no traffic
    [note] = headroom.starved_notes(few)
    assert note.startswith("traffic: its 2 programs each waited") and "500 ms" in note


def test_a_thread_seen_asleep_is_credited_no_more_wait_than_it_had_time_for() -> None:
    """Made-up readings of one thread. The kernel charged an OVS revalidator seen asleep
    497 ms within 10 ms (its sleep between rounds, counted as waiting): what fits in the
    time since it was seen asleep, less what it ran, counts; a thread runnable at every
    read since keeps its whole wait."""
    ms = 1_000_000
    asleep = headroom.ThreadReading(run_ns=50 * ms, wait_ns=300 * ms, last_asleep=10.00)
    # Seen asleep at 10.00, read again at 10.01 having been charged 497 ms and run 3 ms.
    assert headroom.credible_wait(asleep, 53 * ms, 797 * ms, 10.01) == 7 * ms
    # Charged 4 ms in the same 10 ms: all of it counts.
    assert headroom.credible_wait(asleep, 53 * ms, 304 * ms, 10.01) == 4 * ms
    # Runnable since 9.0 (its last sleep a second before): 500 ms waited in one go counts.
    waiting = headroom.ThreadReading(run_ns=50 * ms, wait_ns=300 * ms, last_asleep=9.00)
    assert headroom.credible_wait(waiting, 60 * ms, 800 * ms, 10.01) == 500 * ms
    # A counter that went back (a reused thread id) credits nothing.
    assert headroom.credible_wait(asleep, 0, 0, 10.5) == 0
