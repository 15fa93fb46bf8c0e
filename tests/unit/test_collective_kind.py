"""The collective kind without a network: checks, placement, balanced paths, job metrics."""

from __future__ import annotations

import random

import pytest

from lab import run
from lab.kinds.collective import metrics as jm
from lab.kinds.collective import plan as kind
from lab.model.errors import ScenarioError
from lab.model.flows import FlowSpec
from lab.net.topologies import describe, make_topology

LEAFSPINE = {"type": "leafspine", "spines": 4, "leaves": 2, "hosts_per_leaf": 4}


def topo(**over):
    return describe(make_topology({**LEAFSPINE, **over}))


def phases(**params):
    return kind.check(params, topo())


@pytest.mark.parametrize("sets, field", [
    (["job.size_bytes=1000001"], "job.size_bytes"),          # S not divisible into chunks
    (["job.workers=1"], "job.workers"),                       # N < 2
    (["job.workers=12", "job.size_bytes=1200"], "job.workers"),  # more ranks than hosts
    (["job.buckets=3"], "job.size_bytes"),                    # chunks x buckets
    (["ecn.k_bytes=0"], "ecn.k_bytes"),                       # K <= 0
    (["phases.ecn.ecn.k_bytes=-5"], "phases.ecn.ecn.k_bytes"),
    (["ecn.kmin_bytes=90000", "ecn.kmax_bytes=1000"], "ecn.kmin_bytes"),  # Kmin > Kmax
    (["ecn.pmax=0"], "ecn.pmax"),
    (["ecn.ports=[leaf9-eth3]"], "ecn.ports"),                # a port that does not exist
    (["ecn.ports=[]", "phases.ecn.ecn.marking=step"], "ecn.ports"),
    (["placement.receiver=h99"], "placement.receiver"),
    (["job.straggler_rank=8"], "job.straggler_rank"),
    (["phases.ecn.job.pattern=ring", "phases.ecn.microburst.senders=2"],
     "phases.ecn.microburst.senders"),
])
def test_bad_input_names_the_field(sets, field):
    if field.startswith("phases.ecn.microburst"):
        sets = [*sets, "phases.ecn.job.size_bytes=1048576"]
    with pytest.raises(ScenarioError) as err:
        run.make_plans("incast-ecn" if "ecn" in " ".join(sets) or "receiver" in sets[0]
                       else "allreduce-ecmp", sets=sets)
    assert err.value.field == field, str(err.value)


def test_every_scenario_validates():
    for name in ("allreduce-ecmp", "allreduce-placement", "allreduce-shared-link", "incast-ecn"):
        plans = run.make_plans(name)
        assert plans and plans[0].scenario.kind == "collective"


def test_phases_override_only_their_keys():
    pp = phases(job={"steps": 10}, phases={"a": {}, "b": {"job": {"steps": 3}}})
    assert list(pp) == ["a", "b"]
    assert pp["a"]["job"]["steps"] == 10 and pp["b"]["job"]["steps"] == 3
    assert pp["b"]["job"]["size_bytes"] == kind.DEFAULTS["job"]["size_bytes"]


def test_placement_modes():
    t = topo()
    pp = phases()["run"]
    assert kind.place_workers(t, pp, random.Random(1)) == [f"h{i}" for i in range(1, 9)]
    pp["placement"]["hosts"] = "interleaved"
    assert kind.place_workers(t, pp, random.Random(1)) == ["h1", "h5", "h2", "h6", "h3",
                                                           "h7", "h4", "h8"]
    pp["placement"]["hosts"] = "scattered"
    a = kind.place_workers(t, pp, random.Random(1))
    assert sorted(a, key=lambda h: int(h[1:])) == [f"h{i}" for i in range(1, 9)]
    assert a != sorted(a, key=lambda h: int(h[1:]))


def test_storage_hosts_never_run_workers():
    t = topo(leaves=3)
    pp = kind.check({"storage": {"hosts": ["h9", "h10"], "mode": "shared"}}, t)["run"]
    for mode in ("packed", "interleaved", "scattered"):
        pp["placement"]["hosts"] = mode
        assert not {"h9", "h10"} & set(kind.place_workers(t, pp, random.Random(2)))


def test_balanced_pins_put_one_connection_per_uplink():
    t = topo()
    pp = phases(job={"epoch_steps": 2, "steps": 4})["run"]
    pp["placement"]["hosts"] = "interleaved"
    hosts = kind.place_workers(t, pp, random.Random(1))
    ips = {h["name"]: h["ip"] for h in t["hosts"]}
    conns = kind.ring_conns(hosts, ips, pp["job"], list(range(30000, 30100)), 0)
    assert len(conns) == 16 and len({c.index for c in conns}) == 16
    leaf_of = {h: ("leaf1" if int(h[1:]) <= 4 else "leaf2") for h in ips}
    pins = kind.balanced_pins(conns, leaf_of, kind.uplink_ports(t))
    assert len(pins) == 16                       # every hop crosses racks
    for epoch_pins in (pins[:8], pins[8:]):
        per_uplink = {}
        for p in epoch_pins:
            per_uplink[(p["switch"], p["port"])] = per_uplink.get((p["switch"], p["port"]),
                                                                  0) + 1
        assert max(per_uplink.values()) == 1     # 4 connections per leaf on 4 spines
    assert {p["proto"] for p in pins} == {6}


def test_balanced_pins_match_a_roce_rings_udp():
    """A pin names the connection's own protocol: a RoCE QP's UDP, or the switches never
    match it and the policy's hash places it after all."""
    t = topo()
    ips = {h["name"]: h["ip"] for h in t["hosts"]}
    leaf_of = {h: ("leaf1" if int(h[1:]) <= 4 else "leaf2") for h in ips}
    qp = FlowSpec(id="r0e0", src="h1", dst="h5", src_ip=ips["h1"], dst_ip=ips["h5"],
                  proto="udp", sport=30000, dport=4791, rate_bps=25e6, kind="allreduce")
    pins = kind.balanced_pins([kind.Conn(qp, 0, 0, 0)], leaf_of, kind.uplink_ports(t))
    assert [(p["proto"], p["dport"]) for p in pins] == [(17, 4791)]


def test_ring_metrics_follow_nccl_tests():
    assert jm.busbw(100.0, 8) == pytest.approx(175.0)
    assert jm.ideal_ring_s(8, 1 << 20, 50e6) == pytest.approx(
        2 * 7 / 8 * 8 * (1 << 20) / (50e6 * 1448 / 1538))
    outputs = []
    for r in range(4):
        steps = []
        for k in range(3):
            t0 = 10.0 + k
            steps.append({"step": k, "epoch": 0, "warmup": k == 0, "t_start": t0,
                          "t_end": t0 + 0.5 + 0.01 * r, "compute_s": 0.1,
                          "comm_s": 0.3 + 0.01 * r, "step_s": 0.5 + 0.01 * r,
                          "idle_s": 0.4 + 0.01 * r})
        outputs.append({"steps": steps})
    flows = [{"kind": "allreduce", "epoch": 0, "id": f"r{r}e0", "path": p}
             for r, p in enumerate([["leaf1", "spine1", "leaf2"], ["leaf2", "spine1", "leaf1"],
                                    ["leaf1", "spine1", "leaf2"], ["leaf1"]])]
    mt = jm.ring_metrics(outputs, 4, 4000, 50e6, flows)
    assert mt["steps"] == 2                      # the warm-up step is not measured
    assert mt["step_p50_s"] == pytest.approx(0.53)       # the slowest rank sets the pace
    assert mt["comm_p50_s"] == pytest.approx(0.33)
    assert mt["algbw_bps"] == round(4000 * 8 / 0.33)
    assert mt["busbw_bps"] == round(mt["algbw_bps"] * 2 * 3 / 4)
    assert mt["epochs"]["0"]["max_flows_per_link"] == 2
    assert mt["epochs"]["0"]["shared_links"] == {"leaf1->spine1": ["r0e0", "r2e0"],
                                                 "spine1->leaf2": ["r0e0", "r2e0"]}
    assert mt["gpu_idle_fraction"] == pytest.approx((0.4 + 0.41 + 0.42 + 0.43)
                                                    / (0.5 + 0.51 + 0.52 + 0.53), abs=1e-4)
    assert len(mt["step_series"]) == 3 and mt["step_series"][1]["collided"]


def test_checkpoint_overlap_is_with_the_steps_communication():
    steps = [{"t_start": 0.0, "t_comm_start": 0.25, "t_end": 1.0},
             {"t_start": 1.0, "t_comm_start": 1.25, "t_end": 2.0}]
    assert [jm.overlaps(s, [(0.9, 0.95)]) for s in steps] == [True, False]
    # A checkpoint that ended while the step computed did not share its NIC with it.
    assert [jm.overlaps(s, [(0.5, 1.1)]) for s in steps] == [True, False]


def test_percentile_and_queue_delay():
    assert jm.percentile([], 99) == 0.0
    assert jm.percentile([1, 2, 3, 4], 50) == 2.5
    assert jm.queue_delay_ms([0, 62500], 50e6) == {"p50": 5.0, "p99": 9.9, "max": 10.0}
