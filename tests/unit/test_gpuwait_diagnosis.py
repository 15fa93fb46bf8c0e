"""The GPU-wait diagnosis on made-up measurements, without root: one phase per cause, the
mixes, the near-threshold cases, and whose traffic a flow is read from the scheduler's map
alone (the same flows are another job's or no job's by that map, never by a label).

A phase here is what the lab's result holds: the step's shares of the last rank to finish
computing, the ranks' compute and their loaders' records, the flows with their ends, paths
and per-switch bytes, the links, and the scheduler's map; on a leaf-spine of three leaves
of four hosts (50 Mbit/s host links, 20 Mbit/s uplinks).
"""

from __future__ import annotations

from typing import Any

import pytest

from lab.analysis import gpuwait
from lab.kinds.collective.scheduler import scheduler_map
from lab.net.topologies import describe, make_topology

TOPO = describe(make_topology({"type": "leafspine", "spines": 2, "leaves": 3,
                               "hosts_per_leaf": 4, "host_bw": 50, "fabric_bw": 20}))
#: Six ranks, more than a rack holds, in two racks (h1-h3 on leaf1, h5-h7 on leaf2): their
#: ring crosses the 20 Mbit/s uplinks however they are placed. Storage on leaf3.
JOB, STORAGE = ["h1", "h2", "h3", "h5", "h6", "h7"], ["h11"]
#: Four ranks in those two racks, which would fit in one.
SPREAD = ["h1", "h2", "h5", "h6"]
MB = 1_000_000


def route(a: str, b: str) -> list[str]:
    """A flow's switches: its leaf, or its leaf, spine1 and the other's leaf."""
    leaf = {h: f"leaf{(int(h[1:]) - 1) // 4 + 1}" for h in (a, b)}
    return [leaf[a]] if leaf[a] == leaf[b] else [leaf[a], "spine1", leaf[b]]


def flow(a: str, b: str, nbytes: int, interface: str = "fabric") -> dict[str, Any]:
    path = route(a, b)
    return {"src": a, "dst": b, "path": path, "hop_bytes": dict.fromkeys(path, nbytes),
            "bytes": nbytes, "interface": interface, "src_ip": f"10.0.0.{a[1:]}"}


def phase(*, data_wait: float = 0.0, exposed: float = 0.4, ideal: float = 0.4,
          fetch_share: float = 0.9, computes: tuple[float, ...] = (0.6,) * 6,
          lag: float = 0.0, others: list[dict[str, Any]] | None = None,
          other_jobs: list[str] | None = None, bottleneck_mbps: float = 20.0,
          interface: str = "fabric", uplink_util: float = 0.9, job: list[str] = JOB,
          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metrics, details) of one phase with a 1 s step: the last rank's shares of it
    (compute is what the others leave), the all-reduce's ideal share, the loaders' split."""
    compute = 1.0 - data_wait - exposed
    links = [{"node": "leaf1", "peer": "spine1", "util_mean": uplink_util, "drops": 0,
              "bw_mbps": 20.0, "tx_bytes": 20 * MB},
             {"node": "spine1", "peer": "leaf2", "util_mean": 0.5, "drops": 0, "bw_mbps": 20.0,
              "tx_bytes": 10 * MB},
             {"node": "leaf3", "peer": "h11", "util_mean": 0.1, "drops": 0, "bw_mbps": 50.0,
              "tx_bytes": MB}]
    ranks = [{"rank": i, "steps": [{"compute_s": c, "warmup": False}] * 5,
              "loader": {"per_worker": [{"fetch_s": fetch_share, "prep_wall_s": 1 - fetch_share,
                                         "batches": 10}]}}
             for i, c in enumerate(computes)]
    flows = [flow(a, b, 4 * MB, interface) for a, b in zip(job, job[1:] + job[:1], strict=True)]
    flows += [flow("h11", h, MB) for h in job]
    flows += others or []
    metrics = {"gpu_wait": {"critical_share": {"data_wait": data_wait, "compute": compute,
                                               "exposed_comm": exposed, "barrier": 0.0},
                            "compute_lag_share": lag, "queue_empty_steps": 0,
                            "rank_steps": 20},
               "step_mean_s": 1.0, "ideal_comm_s": ideal,
               "bottleneck_bps": bottleneck_mbps * 1e6, "drops": 0, "retransmits": 0}
    details = {"duration_s": 8.0, "links": links, "flows": flows,
               "gpu_wait": {"ranks": ranks},
               "scheduler": scheduler_map(job, other_jobs or [], STORAGE)}
    return metrics, details


def named(metrics: dict[str, Any], details: dict[str, Any]) -> list[str]:
    return gpuwait.diagnose_phase(metrics, details, TOPO)["named"]


#: Two flows on the ring's uplink (leaf1 -> spine1) from h4 to h8 and h9, hosts of no job
#: unless a map says so: 6x the ring's bytes there.
BESIDE = [flow("h4", "h8", 12 * MB), flow("h4", "h9", 12 * MB)]
OTHER_JOB = ["h4", "h8", "h9"]


def test_a_healthy_phase_names_nothing() -> None:
    assert named(*phase()) == []


@pytest.mark.parametrize("fetch_share, cause", [(0.9, "data"), (0.1, "cpu")])
def test_a_data_wait_is_storages_or_the_cpus_by_what_the_loaders_spent_time_on(
        fetch_share: float, cause: str) -> None:
    assert named(*phase(data_wait=0.3, exposed=0.4, fetch_share=fetch_share)) == [cause]


def test_the_same_flows_are_another_jobs_or_the_networks_by_the_scheduler_map() -> None:
    """h4, h8 and h9 run a job: their flows on the ring's uplink are another job's.
    The map without it: the same bytes are traffic of no job, and the cause the network's."""
    as_job = phase(exposed=0.7, ideal=0.4, others=BESIDE, other_jobs=OTHER_JOB)
    assert named(*as_job) == ["other-job"]
    assert named(*phase(exposed=0.7, ideal=0.4, others=BESIDE)) == ["network"]
    # Hosts of another job, but the flows cross between it and hosts of none: not its.
    crossing = [flow("h4", "h10", 12 * MB), flow("h4", "h12", 12 * MB)]
    assert named(*phase(exposed=0.7, ideal=0.4, others=crossing,
                        other_jobs=OTHER_JOB)) == ["network"]


def test_no_label_on_a_flow_enters_a_verdict() -> None:
    """Flows tagged as the lab once tagged them, the tags saying the opposite of the map:
    the verdict is the map's."""
    metrics, details = phase(exposed=0.7, ideal=0.4, others=BESIDE)
    for f in details["flows"]:
        f["kind"] = "other-job"
    assert named(metrics, details) == ["network"]


def test_a_placement_across_racks_is_named_against_the_racks_it_fits_in() -> None:
    """Four ranks fit a leaf of four hosts (50 Mbit/s); spread, they cross 20 Mbit/s
    uplinks: the ideal at 20 is 2.5x the one at 50, and the gap is the placement's. Six
    ranks fit no rack: the same uplinks are no placement's doing."""
    assert named(*phase(exposed=0.5, ideal=0.5, job=SPREAD)) == ["placement"]
    assert named(*phase(exposed=0.5, ideal=0.5)) == []


def test_a_ring_off_the_fabric_is_the_interfaces() -> None:
    """The ring on a 5 Mbit/s management NIC: its ideal there against the fabric's 20."""
    assert named(*phase(exposed=0.5, ideal=0.5, interface="mgmt",
                        bottleneck_mbps=5.0)) == ["interface"]


def test_a_straggler_is_one_rank_computing_longer_all_along() -> None:
    slow = (0.4, 0.4, 0.7, 0.4, 0.4, 0.4)
    assert named(*phase(exposed=0.3, ideal=0.3, computes=slow, lag=0.3)) == ["straggler"]
    # The same lag with every rank computing alike is a late batch's or jitter's.
    assert named(*phase(exposed=0.3, ideal=0.3, lag=0.3)) == []


def test_a_mix_names_both_largest_first() -> None:
    got = named(*phase(data_wait=0.25, exposed=0.6, ideal=0.3, others=BESIDE,
                       other_jobs=OTHER_JOB))
    assert got == ["other-job", "data"]


@pytest.mark.parametrize("share, is_named", [(gpuwait.NAMED_MIN_SHARE - 0.001, False),
                                             (gpuwait.NAMED_MIN_SHARE + 0.001, True)])
def test_a_cause_is_named_from_its_share_of_the_step(share: float, is_named: bool) -> None:
    assert (named(*phase(data_wait=share, exposed=0.4, fetch_share=1.0)) == ["data"]) \
        is is_named
    beyond = phase(exposed=0.4 + share, ideal=0.4, others=BESIDE)
    assert (named(*beyond) == ["network"]) is is_named


def test_whose_traffic_a_flow_is() -> None:
    sched = gpuwait.Scheduler.of({"scheduler": scheduler_map(JOB, OTHER_JOB, STORAGE)})
    assert [sched.whose({"src": a, "dst": b}) for a, b in (
        ("h1", "h5"), ("h11", "h2"), ("h2", "h11"), ("h4", "h9"), ("h4", "h10"), ("h10", "h12"),
        ("h1", "h4"))] == [gpuwait.JOB, gpuwait.JOB_DATA, gpuwait.JOB_DATA, gpuwait.OTHER_JOB,
                           gpuwait.NO_JOB, gpuwait.NO_JOB, gpuwait.NO_JOB]
    # A result without a map has no job: nothing is its all-reduce.
    assert gpuwait.job_flows({"flows": [{"src": "h1", "dst": "h2"}]}) == []
