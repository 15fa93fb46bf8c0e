"""Paths rebuilt from per-switch counters."""

from lab.model.flowpaths import adjacency, attachment, path_from_counters
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
