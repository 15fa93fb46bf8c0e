"""Topologies: names, ports, rates and refusals, without building anything."""

import pytest

from lab.model.errors import TopologyError
from lab.net.topobase import host_addr, planned_names
from lab.net.topologies import TOPOLOGIES, FatTree, LeafSpine, describe, make_topology


def test_leafspine_names_ports_and_oversubscription():
    topo = LeafSpine(spines=2, leaves=4, hosts_per_leaf=2, host_bw=50, fabric_bw=100)
    d = describe(topo)
    assert sorted(s["name"] for s in d["switches"]) == [
        "leaf1", "leaf2", "leaf3", "leaf4", "spine1", "spine2"]
    assert len(d["hosts"]) == 8
    # every leaf reaches every spine, leaf j on spine port j, spine i on leaf port hpl+i
    fabric = [(ln["a"], ln["a_port"], ln["b"], ln["b_port"]) for ln in d["links"]
              if ln["b"].startswith("spine")]
    assert ("leaf3", 4, "spine2", 3) in fabric
    assert len(fabric) == 8
    assert d["oversubscription"] == pytest.approx(2 * 50 / (2 * 100))
    assert {ln["bw_mbps"] for ln in d["links"] if ln["a"].startswith("h")} == {50.0}


def test_dpids_are_distinct_across_tiers():
    d = describe(LeafSpine(spines=3, leaves=3))
    dpids = [s["dpid"] for s in d["switches"]]
    assert len(set(dpids)) == len(dpids)


def test_fattree_k4_shape():
    d = describe(FatTree(k=4))
    roles = [s["role"] for s in d["switches"]]
    assert roles.count("core") == 4 and roles.count("agg") == 8 and roles.count("edge") == 8
    assert len(d["hosts"]) == 16
    assert len(d["links"]) == 16 + 16 + 16
    # each core reaches every pod exactly once
    for core in (s["name"] for s in d["switches"] if s["role"] == "core"):
        pods = {ln["b_port"] for ln in d["links"] if ln["b"] == core}
        assert pods == {1, 2, 3, 4}


@pytest.mark.parametrize("spec, field", [
    ({"type": "leafspine", "spines": 0}, "topology.spines"),
    ({"type": "leafspine", "leaves": "two"}, "topology.leaves"),
    ({"type": "leafspine", "fabric_bw": 0}, "topology.fabric_bw"),
    ({"type": "leafspine", "host_bw": 40000}, "topology.host_bw"),
    ({"type": "fattree", "k": 5}, "topology.k"),
    ({"type": "fattree", "k": 16}, "topology.k"),
    ({"type": "ring"}, "topology.type"),
    ({"type": "leafspine", "colour": "red"}, "topology.colour"),
])
def test_impossible_topologies_are_refused_naming_the_field(spec, field):
    with pytest.raises(TopologyError) as exc:
        make_topology(spec)
    assert exc.value.field == field
    assert str(exc.value).startswith(field + ":")


def test_planned_names_cover_every_switch_port():
    topo = LeafSpine(spines=2, leaves=2, hosts_per_leaf=2)
    bridges, intfs = planned_names(topo)
    assert sorted(bridges) == ["leaf1", "leaf2", "spine1", "spine2"]
    assert "leaf1-eth1" in intfs and "spine2-eth2" in intfs
    assert not any(i.startswith("h") for i in intfs)
    assert all(len(i) < 16 for i in intfs)   # IFNAMSIZ


def test_host_addresses_are_unique():
    addrs = {host_addr(n).ip for n in range(1, 600)}
    macs = {host_addr(n).mac for n in range(1, 600)}
    assert len(addrs) == len(macs) == 599


def test_every_topology_registers_and_describes_itself():
    """The streaming edge is in the registry like the fabrics, an unknown type is refused
    naming all of them, and what a topology adds to its description comes from the topology
    (a subclass's own additions appear without describe() knowing the class)."""
    assert set(TOPOLOGIES) == {"leafspine", "fattree", "streaming-edge"}
    assert all(TOPOLOGIES[name].kind == name for name in TOPOLOGIES)
    with pytest.raises(TopologyError, match="known: fattree, leafspine, streaming-edge"):
        make_topology({"type": "torus"})
    edge = describe(make_topology({"type": "streaming-edge"}))
    assert {"routers", "router_links", "external_hosts"} <= set(edge)
    plain = describe(LeafSpine())
    assert "routers" not in plain and "pod" not in plain["switches"][0]
    pods = {s["name"]: s["pod"] for s in describe(FatTree(k=4))["switches"]}
    assert pods["edge1"] == pods["agg1"] == 1 and pods["edge8"] == 4 and pods["core1"] is None

    class Tagged(LeafSpine):
        def describe_switch(self, name: str) -> dict[str, object]:
            return {"rack": name.upper()}

        def describe_extras(self) -> dict[str, object]:
            return {"note": "tagged"}

    d = describe(Tagged(spines=1, leaves=1, hosts_per_leaf=1))
    assert d["note"] == "tagged" and {s["rack"] for s in d["switches"]} == {"SPINE1", "LEAF1"}
