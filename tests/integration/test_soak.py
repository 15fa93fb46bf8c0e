"""A short soak: consecutive runs leave nothing behind and grow nothing (bench/soak.py).

The benchmark runs 30; this runs 4 so the suite notices a per-run leak (an interface, a
namespace, a file descriptor in ovs-vswitchd, state-folder bytes) without taking minutes.
The measuring code is the benchmark's own, loaded from its file, so the two cannot drift.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

from lab.machine import state
from tests.integration.support import REPO

os.environ.setdefault(state.LOCK_WAIT_ENV, "1800")


def load_soak():
    spec = importlib.util.spec_from_file_location("bench_soak", REPO / "bench" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module        # dataclasses look their module up while defining
    spec.loader.exec_module(module)
    return module


def test_four_runs_leave_nothing_and_grow_nothing(tmp_path):
    soak = load_soak()
    report = soak.soak(runs=4, duration=2.0, results=tmp_path)
    soak.print_table(report)
    assert not report["failed_runs"], json.dumps(report["per_run"], indent=1)
    assert not report["leftovers"], report["leftovers"]
    assert not report["leaks"], report["leaks"]
    # Every run's controller was seen and sampled: the memory column measured something.
    assert all(r["rss_peak_kib"] for r in report["per_run"]), report["per_run"]
    assert soak.ok(report)


def test_growth_of_one_per_run_is_a_leak_and_a_blip_is_not():
    """The verdict itself, on made-up samples: a descriptor leaked per run is found, one
    colleague's namespace that comes and goes is not (no emulation)."""
    soak = load_soak()
    fds = [28, 29, 30, 31, 32, 33, 34, 35, 36, 37]
    netns = [1, 1, 4, 1, 1, 1, 1, 1, 1, 1]
    samples = [soak.Sample(netns=n, fds={"ovs-vswitchd": f, "ovsdb-server": 22})
               for f, n in zip(fds, netns, strict=True)]
    leaks = soak.leaks_in(samples, soak.growth(samples))
    assert len(leaks) == 1 and leaks[0].startswith("ovs-vswitchd fds grew 28 -> 37"), leaks
