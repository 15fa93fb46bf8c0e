"""The collective kind on RoCE (``job.transport: roce``, ``incast``): every setting it
cannot run is refused before anything starts, naming the key as the user wrote it."""

from __future__ import annotations

import random

import pytest

from lab import run
from lab.kinds.collective import metrics as jm
from lab.kinds.collective import roce
from lab.kinds.collective.plan import phase_params
from lab.model import lossless
from lab.model.errors import ScenarioError
from lab.model.flows import FlowSpec


@pytest.mark.parametrize("sets, field", [
    (["job.library=gloo"], "job.transport"),           # gloo speaks TCP only
    (["job.buckets=2"], "job.buckets"),
    (["job.sizes=[262144, 524288]"], "job.sizes"),
    (["job.straggler_rank=1", "job.straggler_s=0.1"], "job.straggler_rank"),
    (["loader.enabled=true", "storage.hosts=[h4]"], "loader.enabled"),
    (["roce.mtu=2048"], "roce.mtu"),                    # larger than the links'
    (['phases.dcqcn.ecn.marking="off"'], "phases.dcqcn.roce.cc"),   # DCQCN, nothing marks
    (["pfc.xoff_bytes=75000"], "pfc.xoff_bytes"),       # XOFF at the queue's size
    (["pfc.xon_bytes=20000"], "pfc.xon_bytes"),         # XON above XOFF
    (["pfc.priority=4"], "pfc.priority"),               # no class on priority 4
    (["classes.host_bytes=50000"], "classes.host_bytes"),   # below a 64 KiB ring chunk
    (["incast.from=[h7, h99]"], "incast.from"),
    (["incast.to=h99"], "incast.to"),
    (["incast.from=[h7, h1]"], "incast.from"),          # h1 runs a rank of the job
    (["incast.to=h5"], "incast.to"),                    # so does h5
    (["incast.from=[h4]"], "incast.to"),                # h4 to itself
    (["phases.alone.incast.to=h4"], "phases.alone.incast.from"),  # a receiver, no sender
    (["topology.link_delay_ms=1"], "topology.link_delay_ms"),
])
def test_bad_input_names_the_key(sets: list[str], field: str) -> None:
    with pytest.raises(ScenarioError) as err:
        run.check_input("roce-allreduce", None, sets, None, None)
    assert err.value.field == field, str(err.value)


def test_a_tcp_ring_beside_the_incast_runs_on_the_lossless_fabric() -> None:
    """A phase whose ring is TCP still has the incast's RoCE: the run lays the classes, and
    marking with no port named marks every switch port."""
    given = run.check_input("roce-allreduce", None, ['job.transport="tcp"'], None, None)
    phases = phase_params(given.params)
    assert all(roce.uses_lossless(pp) for n, pp in phases.items() if n != "alone")
    assert not roce.uses_lossless(phases["alone"])


def test_gloo_is_refused_with_why() -> None:
    with pytest.raises(ScenarioError) as err:
        run.check_input("roce-allreduce", None, ["job.library=gloo"], None, None)
    assert "gloo speaks TCP only" in str(err.value)


@pytest.mark.parametrize("scenario, sets, why", [
    ("roce-allreduce", ["roce.spray=64"], "pins each ring QP"),       # its ring is placed
    ("roce-allreduce", ["roce.spray=257"], ""),                       # past a port block
    ("allreduce-ecmp", ["roce.spray=4"], "no RoCE QP to spray"),      # a TCP ring
])
def test_spraying_what_cannot_be_sprayed_names_the_key(scenario: str, sets: list[str],
                                                      why: str) -> None:
    with pytest.raises(ScenarioError) as err:
        run.check_input(scenario, None, sets, None, None)
    assert err.value.field == "roce.spray" and why in str(err.value), str(err.value)


def test_a_sprayed_qp_is_one_connection_on_every_link_it_took() -> None:
    """Collisions count connections: a sprayed QP's 5-tuples are one QP wherever they go."""
    flows = [{"id": "r0e0", "kind": "allreduce", "epoch": 0, "path": ["leaf1", "spine1"]},
             {"id": "r0e0~1", "subflow_of": "r0e0", "kind": "allreduce", "epoch": 0,
              "path": ["leaf1", "spine1"]},
             {"id": "r0e0~2", "subflow_of": "r0e0", "kind": "allreduce", "epoch": 0,
              "path": ["leaf1", "spine2"]},
             {"id": "r1e0", "kind": "allreduce", "epoch": 0, "path": ["leaf1", "spine2"]}]
    e = jm.epoch_collisions(flows)[0]
    assert e["max_flows_per_link"] == 2 and e["shared_links"] == {"leaf1->spine2":
                                                                 ["r0e0", "r1e0"]}


def test_spray_blocks_are_each_qps_own() -> None:
    bases = lossless.spray_blocks(3, {33024}, random.Random(1))
    assert len(set(bases)) == 3
    for b in bases:
        assert b % lossless.SPRAY_BLOCK == 0 and not b <= 33024 < b + lossless.SPRAY_BLOCK


def test_a_roce_flows_answers_are_watched_where_the_responder_sends_them() -> None:
    """A responder answers from the port its data came from, to 4791 (lab/agents/roce's
    reply_port): the reverse entry is that 5-tuple, not the TCP-style swap of ports."""
    qp = FlowSpec(id="q", src="h1", dst="h5", src_ip="10.0.0.1", dst_ip="10.0.0.5",
                  proto="udp", sport=33280, dport=4791, rate_bps=0.0)
    fwd, rev = qp.watch_entries(0)
    assert (fwd["src"], fwd["sport"], fwd["dst"], fwd["dport"]) == \
        ("10.0.0.1", 33280, "10.0.0.5", 4791)
    assert (rev["src"], rev["sport"], rev["dst"], rev["dport"]) == \
        ("10.0.0.5", 33280, "10.0.0.1", 4791)
    tcp = FlowSpec(id="t", src="h1", dst="h5", src_ip="10.0.0.1", dst_ip="10.0.0.5",
                   proto="tcp", sport=40001, dport=5201, rate_bps=0.0)
    assert (tcp.watch_entries(0)[1]["sport"], tcp.watch_entries(0)[1]["dport"]) == \
        (5201, 40001)
