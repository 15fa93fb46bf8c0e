"""Elephants beside a collective job: each bad pair is one error naming its field, before
anything starts; a good one is planned as a counted connection, pinned with the ring hop it
collides with."""

from __future__ import annotations

import pytest

from lab import run
from lab.kinds.collective import elephant
from lab.kinds.collective.plan import Conn, uplink_ports
from lab.model.errors import ScenarioError
from lab.model.flowpaths import attachment
from lab.model.flows import FlowSpec


@pytest.mark.parametrize("sets, field, words", [
    (["phases.network.elephant.pairs=[[h7]]"], "phases.network.elephant.pairs",
     "expected [source, destination]"),
    (["phases.network.elephant.pairs=[[h7, h99]]"], "phases.network.elephant.pairs",
     "no host 'h99'"),
    (["phases.network.elephant.pairs=[[h11, h7]]"], "phases.network.elephant.pairs",
     "storage host"),
    (["phases.network.elephant.pairs=[[h7, h7]]"], "phases.network.elephant.pairs",
     "one host"),
    # six ranks packed: h1-h4 and h5, h6
    (["phases.network.elephant.pairs=[[h1, h9]]"], "phases.network.elephant.pairs",
     "runs a rank"),
    (["phases.network.elephant.pairs=[[h7, h8]]"], "phases.network.elephant.pairs",
     "crosses no uplink"),
    # four ranks in one rack: no ring hop leaves any leaf
    (["phases.healthy.elephant.pairs=[[h7, h9]]"], "elephant.collide", "no ring hop leaves"),
    (["elephant.mbps=-1"], "elephant.mbps", ""),
    (["elephant.collide=maybe"], "elephant.collide", ""),
])
def test_bad_elephants_name_the_field(sets: list[str], field: str, words: str) -> None:
    with pytest.raises(ScenarioError) as err:
        run.make_plans("gpu-wait", sets=sets)
    assert err.value.field == field, str(err.value)
    assert words in str(err.value)


def test_an_elephant_that_need_not_collide_may_stay_in_a_rack() -> None:
    """The same pair that is refused when it must collide ("crosses no uplink", above) is
    planned as given when it need not."""
    plan = run.make_plans("gpu-wait", sets=["phases.network.elephant.pairs=[[h7, h8]]",
                                            "phases.network.elephant.collide=false"])[0]
    assert plan.params["phases"]["network"]["elephant"] == {"pairs": [["h7", "h8"]],
                                                            "collide": False}


def test_a_colliding_elephant_is_pinned_with_the_ring_hop_leaving_its_leaf() -> None:
    plan = run.make_plans("gpu-wait")[0]
    topo = plan.topo_desc
    ips = {h["name"]: h["ip"] for h in topo["hosts"]}
    leaf_of = attachment(topo)
    hosts = ["h1", "h2", "h3", "h4", "h5", "h6"]
    ring = [Conn(FlowSpec(id=f"r{i}", src=a, dst=b, src_ip=ips[a], dst_ip=ips[b], proto="tcp",
                          sport=20000 + i, dport=7100 + i, rate_bps=0.0, kind="allreduce"),
                 i, 0, i)
            for i, (a, b) in enumerate(zip(hosts, hosts[1:] + hosts[:1], strict=True))]
    pp = {"elephant": {"pairs": [["h7", "h9"]], "mbps": 0.0, "collide": True},
          "job": {"cc": "cubic"}}
    els = elephant.conns(pp, ips, [31000], 10)
    assert [(c.spec.src, c.spec.dst, c.spec.kind, c.spec.dport) for c in els] == \
        [("h7", "h9", "elephant", elephant.ELEPHANT_PORT)]
    up = uplink_ports(topo)
    pins = elephant.collision_pins(els, ring, leaf_of, up, [])
    # h6 -> h1 is the ring hop leaving leaf2, h7's leaf: both on leaf2's uplink to spine1
    assert [(p["switch"], p["port"], p["sport"]) for p in pins] == \
        [("leaf2", up[("leaf2", "spine1")], 20005), ("leaf2", up[("leaf2", "spine1")], 31000)]
    # a hop already pinned keeps its uplink, and the elephant joins it there
    held = [{**pins[0], "port": up[("leaf2", "spine2")]}]
    again = elephant.collision_pins(els, ring, leaf_of, up, held)
    assert [(p["port"], p["sport"]) for p in again] == [(up[("leaf2", "spine2")], 31000)]
