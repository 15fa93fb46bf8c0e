"""The weathermap's tiers, cables and flow hops, from the topology sections the lab writes.

The topologies are the lab's own descriptions (``topologies.describe``, what result.json's
``topology`` holds); the counters of real runs are in tests/integration/test_weathermap.py.
"""

from __future__ import annotations

import pytest

from lab.net.topologies import describe, make_topology
from lab.plotting.plots import Skipped
from lab.plotting.sections import Section
from lab.plotting.weathermap import (
    Arc,
    arcs_of,
    fabric_of,
    flow_hops,
    hottest,
    weathermap_spec,
)


def result_of(topo: dict) -> dict:
    return {"topology": describe(make_topology(topo))}


@pytest.mark.parametrize("topo, tiers", [
    ({"type": "leafspine"}, ["hosts", "leaves", "spines"]),
    ({"type": "fattree", "k": 4}, ["hosts", "edge switches", "aggregation", "core"]),
    ({"type": "streaming-edge"}, ["hosts", "leaves", "spines", "DC core router",
                                  "border routers", "ISPs", "ISP hosts"]),
])
def test_tiers_follow_the_roles(topo, tiers):
    fabric = fabric_of(result_of(topo))
    assert fabric is not None
    assert [label for _, label, _ in fabric.tiers] == tiers
    desc = result_of(topo)["topology"]
    drawn = {n for _, _, nodes in fabric.tiers for n in nodes}
    named = {x["name"] for x in desc["switches"] + desc["hosts"]
             + desc.get("routers", []) + desc.get("external_hosts", [])}
    assert drawn == named                 # every node once, nothing invented
    assert len(fabric.cables) == len(desc["links"]) + len(desc.get("router_links", []))


def test_streaming_tiers_hold_the_right_nodes():
    fabric = fabric_of(result_of({"type": "streaming-edge", "borders": 2, "isps": 2}))
    tiers = {label: nodes for _, label, nodes in fabric.tiers}
    assert tiers["DC core router"] == ["dccore"]
    assert sorted(tiers["border routers"]) == ["border1", "border2"]
    assert sorted(tiers["ISPs"]) == ["isp1", "isp2"]
    # The hosts behind an ISP stand above it: isp1's two before isp2's.
    assert [n[-1] for n in tiers["ISP hosts"]] == ["1", "1", "2", "2"]


def test_hosts_stand_under_their_leaf():
    fabric = fabric_of(result_of({"type": "leafspine", "leaves": 3, "hosts_per_leaf": 4}))
    tiers = {label: nodes for _, label, nodes in fabric.tiers}
    assert tiers["hosts"] == [f"h{i}" for i in range(1, 13)]        # h10 after h9
    assert tiers["leaves"] == ["leaf1", "leaf2", "leaf3"]


def test_parallel_cables_are_told_apart_by_port():
    r = result_of({"type": "streaming-edge", "uplinks": 2})
    fabric = fabric_of(r)
    up = [ln for ln in r["topology"]["router_links"] if ln["a"] == "border1"
          and ln["b"] == "isp1"]
    assert len(up) == 2
    # Counters for the second cable only, as a real run writes them (node, port, peer).
    links = [{"node": "border1", "port": up[1]["a_port"], "peer": "isp1", "bw_mbps": 20.0,
              "util_mean": 0.9, "drops": 7, "ce_marked": 0, "tx_bytes": 1}]
    arcs = arcs_of(fabric, links)
    measured = [a for a in arcs if a.util_pct is not None]
    assert [(a.src, a.dst, a.key, a.port) for a in measured] == \
        [("border1", "isp1", 1, up[1]["a_port"])]
    assert hottest(arcs) == measured[0] and measured[0].drops == 7
    assert sum(1 for a in arcs if a.util_pct is None) == 2 * len(fabric.cables) - 1


def test_no_counters_no_map():
    sec = Section("", 1.0, [], [], {})
    made = weathermap_spec(sec, result_of({"type": "leafspine"}))
    assert isinstance(made, Skipped) and "no link has counters" in made.reason
    assert isinstance(weathermap_spec(sec, {}), Skipped)


def test_idle_fabric_has_no_hottest_link():
    assert hottest([Arc("a", "b", 0, 1, 100.0, 0.0), Arc("b", "a", 0, 1, 100.0, None)]) is None


def test_flow_hops_name_the_router_cable():
    flow = {"src": "h5", "dst": "cdn1",
            "full_path": ["leaf1", "spine1", "leaf2", "dccore", "border1", "isp1"],
            "router_hops": [{"link": "border1-eth3->isp1-eth1", "from": "border1",
                             "to": "isp1"}]}
    hops = flow_hops(flow)
    assert hops[0] == ("h5", "leaf1", None) and hops[-1] == ("isp1", "cdn1", None)
    assert ("border1", "isp1", 3) in hops
    plain = flow_hops({"src": "h1", "dst": "h5", "path": ["leaf1", "spine2", "leaf2"]})
    assert [u for u, _, _ in plain] == ["h1", "leaf1", "spine2", "leaf2"]
