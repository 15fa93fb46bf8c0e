"""A k=6 fat-tree (45 switches, 54 hosts) with a flow per host, at a small rate: the scale
smoke of the suite (k=8 and the rates each size stays valid at are in bench/scale.py).

It checks what breaks first at scale: every pair reachable at bring-up (all-pairs ping from
one raw socket per host), every flow's counted path clean and agreeing with the links'
byte counters, and the emulator's fidelity judged over the traffic's seconds, with the lab's
own CPU recorded. Whether this machine keeps up at a size is a fidelity target, measured by
bench/scale.py (docs/scale.md), not asserted here.
"""

from __future__ import annotations

import pytest

from tests.integration.support import check_links_agree_with_flows, run_to

K, HOSTS, SWITCHES = 6, 54, 45
DURATION_S = 3
#: 5 Mbit/s links: a flow per host keeps one datapath core well inside its budget. At 10
#: Mbit/s the window's first second (54 flows in slow start at once) had 16-20 % idle in 3
#: runs of 7 on the CI machine, under the 25 % line (45-71 % after it); at 5 Mbit/s 43-85 %
#: in 4 of 4.
RATE_SCALE = 0.05
#: The controller's per-flow hash: it decides the announced flows before they start, so a
#: flow per host costs no burst of packet-ins. (The switches' own select groups cost the
#: userspace datapath far more per packet at this size: docs/scale.md.)
POLICY = "hash5"


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    # The verdict is not what this smoke checks (see the fidelity test): one run, whatever it
    # is.
    return run_to(tmp_path_factory.mktemp("k6") / "out", "ecmp-polarisation",
                  "--policy", POLICY, "--set", f"topology.k={K}",
                  "--set", f"traffic.flows={HOSTS}", "--set", f"rate_scale={RATE_SCALE}",
                  "--duration", str(DURATION_S), need_valid=False)


def test_every_pair_reachable_and_every_flow_ran(result: dict) -> None:
    assert len(result["topology"]["hosts"]) == HOSTS
    assert len(result["topology"]["switches"]) == SWITCHES
    assert result["metrics"]["pingall_loss_pct"] == 0
    assert len(result["flows"]) == HOSTS
    for f in result["flows"]:
        assert f["error"] is None and f["bytes"] > 0, f
        assert f["path_clean"], f


def test_paths_agree_with_the_link_counters(result: dict) -> None:
    assert check_links_agree_with_flows(result) == []


def test_the_verdicts_inputs_are_recorded_for_every_second(result: dict) -> None:
    """What the verdict is made from is in the result, a sample per second of the traffic:
    the machine's idle, the datapath's run-queue wait, softirq, and the lab's own CPU; the
    model expected the run valid beforehand. The verdict itself is not asserted: on the CI
    machine one run's first second (54 flows in slow start together) had 22 % idle, the
    others 47-71 %, where five runs here had 43-85 %; that is a timing target,
    bench/scale.py's. The rule is tested on made-up numbers (tests/unit/test_headroom.py)."""
    fid = result["fidelity"]
    assert fid["lab_cpu_pct"] is not None and fid["lab_cpu_pct"] > 0
    assert fid["expected"]["verdict"] == "valid", fid   # the model said so beforehand
    # A second per sample, from the last client's connection (a second may go to connecting).
    for series in ("cpu_idle_pct", "datapath_wait_ms", "softirq_pct"):
        assert len(fid.get(series) or []) >= DURATION_S - 1, (series, fid)
    assert fid["cpu_idle_min_pct"] == min(fid["cpu_idle_pct"]), fid
    assert fid["datapath_wait_max_ms"] == max(fid["datapath_wait_ms"]), fid
