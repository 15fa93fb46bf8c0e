"""Paths rebuilt from per-switch counters."""

from lab.model.flowpaths import adjacency, attachment, link_bytes, path_from_counters
from lab.net.topologies import FatTree, LeafSpine, describe


def test_leafspine_path_from_counters():
    d = describe(LeafSpine(spines=2, leaves=2, hosts_per_leaf=2))
    adj = adjacency(d)
    assert attachment(d)["h3"] == "leaf2"
    path, clean = path_from_counters({"leaf1": 900, "spine2": 880, "leaf2": 870, "spine1": 0},
                                     "leaf1", adj)
    assert path == ["leaf1", "spine2", "leaf2"] and clean


def test_split_flow_is_flagged():
    d = describe(LeafSpine(spines=2, leaves=2, hosts_per_leaf=2))
    path, clean = path_from_counters({"leaf1": 900, "spine1": 400, "spine2": 480, "leaf2": 870},
                                     "leaf1", adjacency(d))
    assert not clean and set(path) == {"leaf1", "spine1", "spine2", "leaf2"}


def test_fattree_path_across_pods():
    d = describe(FatTree(k=4))
    counted = {"edge1": 5, "agg1": 5, "core2": 5, "agg7": 5, "edge8": 5}
    path, clean = path_from_counters(counted, "edge1", adjacency(d))
    assert path == ["edge1", "agg1", "core2", "agg7", "edge8"] and clean


def test_no_counts_no_path():
    d = describe(LeafSpine())
    assert path_from_counters({"leaf1": 0}, "leaf1", adjacency(d)) == ([], True)


def test_link_bytes_of_one_path_are_the_switches_counts():
    d = describe(LeafSpine(spines=2, leaves=2, hosts_per_leaf=2))
    hops = {"leaf1": 900, "spine2": 880, "leaf2": 870, "spine1": 0}
    assert link_bytes(hops, "leaf1", adjacency(d)) == {("leaf1", "spine2"): (900, 880),
                                                       ("spine2", "leaf2"): (880, 870)}


def test_link_bytes_split_a_flow_seen_on_both_spines():
    """A flow's ACK counters from a kernel-datapath ovs-select run in the VM: one 54-byte
    packet crossed spine2, the rest spine1. Its 18344 B reach leaf1 over both spine links in
    those shares, not all over spine2's (the old walk along [leaf2, spine1, spine2, leaf1])."""
    d = describe(LeafSpine(spines=2, leaves=2, hosts_per_leaf=2))
    hops = {"leaf2": 18344, "spine1": 18290, "spine2": 54, "leaf1": 18344}
    path, clean = path_from_counters(hops, "leaf2", adjacency(d))
    assert not clean
    assert link_bytes(hops, path[0], adjacency(d)) == {
        ("leaf2", "spine1"): (18290, 18290), ("leaf2", "spine2"): (54, 54),
        ("spine1", "leaf1"): (18290, 18290), ("spine2", "leaf1"): (54, 54)}


def test_link_bytes_fattree_and_nothing_counted():
    d = describe(FatTree(k=4))
    counted = {"edge1": 5, "agg1": 5, "core2": 5, "agg7": 5, "edge8": 5}
    assert list(link_bytes(counted, "edge1", adjacency(d))) == [
        ("edge1", "agg1"), ("agg1", "core2"), ("core2", "agg7"), ("agg7", "edge8")]
    assert link_bytes({"leaf1": 0}, "leaf1", adjacency(describe(LeafSpine()))) == {}
