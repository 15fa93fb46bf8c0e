"""A phase set to make the GPUs wait for a cause its values cannot produce is warned about
before anything starts, naming the phase and the key; the run still goes ahead."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from lab import run
from lab.kinds.collective import causes
from lab.kinds.collective.plan import phase_params
from lab.net.topologies import describe, make_topology
from tests.integration.support import fabriclab


def warned(*sets: str) -> list[str]:
    return run.kind_warnings(run.make_plans("gpu-wait", sets=list(sets)))


def test_the_lessons_phases_can_each_produce_their_cause() -> None:
    assert warned() == []


@pytest.mark.parametrize("sets, line, count", [
    (["phases.data.storage.link_mbps=5"],
     "warning: [data] phases.data.storage.link_mbps: 5 Mbit/s is at least the most the "
     "loaders can ask of a storage link (2.78 Mbit/s)", 1),
    (["phases.cpu.loader.workers=8"],
     "warning: [cpu] phases.cpu.loader.workers: 8 loader worker(s) preprocess a batch every "
     "50 ms, within the step's 100 ms of compute", 1),
    (["topology.fabric_bw=50"],
     "warning: [placement] phases.placement.placement.hosts: the racks' uplinks (50 Mbit/s) "
     "are no slower than the hosts' links (50 Mbit/s)", 1),
    (["phases.straggler.job.straggler_s=0.02"],
     "warning: [straggler] phases.straggler.job.straggler_s: rank 2 computes 1.20x the "
     "others' 100 ms, within the 1.2x a straggler is told from them by", 1),
    # with no loader, the data and mixed phases' slow storage links feed nothing either
    (["phases.healthy.storage.link_mbps=1", "loader.enabled=false"],
     "warning: [healthy] phases.healthy.storage.link_mbps: nothing reads from the storage "
     "hosts", 3),
])
def test_a_value_that_cannot_make_the_gpus_wait_is_named(sets: list[str], line: str,
                                                         count: int) -> None:
    lines = warned(*sets)
    assert len(lines) == count and lines[0].startswith(line), lines


def test_a_management_lan_as_fast_as_the_fabric_warns_every_phase_bound_to_it() -> None:
    lines = warned("topology.mgmt_bw=50")
    assert [ln.split("]")[0] for ln in lines] == ["warning: [wrong-nic", "warning: [mixed"]
    assert all("job.interface: the management NICs (50 Mbit/s" in ln for ln in lines)


def test_on_a_fat_tree_four_ranks_leave_their_edge_packed_or_not() -> None:
    params = copy.deepcopy(run.make_plans("gpu-wait")[0].params)
    params["topology"] = {"type": "fattree", "k": 4, "host_bw": 50, "fabric_bw": 20,
                          "mgmt_bw": 10}
    params["storage"]["hosts"] = ["h15", "h16"]
    for name in ("network", "racks", "two-jobs", "job-aware"):   # elephants, other jobs
        del params["phases"][name]
    topo = describe(make_topology(params["topology"]))
    assert causes.warnings(SimpleNamespace(params=params, topo_desc=topo)) == [
        "warning: [placement] phases.placement.placement.hosts: 4 ranks do not fit in one "
        "rack (at most 2 hosts free of storage): packed, they cross the racks' uplinks too"]


def test_the_bound_is_the_demand_the_storage_link_can_be_asked() -> None:
    """Four ranks, two storage hosts, two workers: each host serves half of every rank's
    16 KiB batches, at most one a step of 100 ms, in full-size frames on the wire."""
    pp = run.make_plans("gpu-wait")[0].params
    pp = {**pp, "loader": {**pp["loader"], "enabled": True}}
    demand = causes.storage_demand_mbps(phase_params(pp)["data"])
    want = 4 * 0.5 * 16384 * 8 * causes.WIRE_PER_PAYLOAD / 0.1 / 1e6
    assert demand == {"h11": pytest.approx(want), "h12": pytest.approx(want)}
    # one worker a rank: rank r reads from host r mod 2, so each host still serves two ranks
    one = phase_params({**pp, "loader": {**pp["loader"], "workers": 1}})["data"]
    assert causes.storage_demand_mbps(one) == {"h11": pytest.approx(want),
                                               "h12": pytest.approx(want)}
    # just below the demand: the link is the bottleneck, no warning; at it: a warning
    below, at = f"{want * 0.99:.4f}", f"{want * 1.0001:.4f}"
    assert warned(f"phases.data.storage.link_mbps={below}") == []
    assert len(warned(f"phases.data.storage.link_mbps={at}")) == 1


def test_dry_run_prints_the_warning_and_starts_nothing() -> None:
    r = fabriclab("run", "gpu-wait", "--dry-run", "--set", "phases.data.storage.link_mbps=5")
    assert r.returncode == 0
    assert "warning: [data] phases.data.storage.link_mbps: 5 Mbit/s" in r.stdout
