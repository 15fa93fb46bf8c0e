"""The diagnosis's "placed as well as this fabric allows" reads racks as the switches hosts
hang from, so a leaf-spine and a fat-tree are judged alike: a ring that fits in a rack is
bounded by its hosts' links, one that does not by the racks' uplinks."""

from __future__ import annotations

import pytest

from lab.analysis import gpuwait
from lab.kinds.collective.scheduler import scheduler_map
from lab.net.topologies import describe, make_topology


def ring(hosts: list[str], storage: tuple[str, ...] = ()) -> dict:
    """A phase as the diagnosis reads it: the scheduler's map, the job's all-reduce leaving
    each host, and a loader flow from each storage host."""
    flows = [{"src": h, "dst": hosts[(i + 1) % len(hosts)]} for i, h in enumerate(hosts)]
    flows += [{"src": s, "dst": hosts[0]} for s in storage]
    return {"flows": flows, "scheduler": scheduler_map(hosts, [], storage)}


LEAFSPINE = {"type": "leafspine", "spines": 2, "leaves": 3, "hosts_per_leaf": 4,
             "host_bw": 50, "fabric_bw": 20}
FATTREE = {"type": "fattree", "k": 4, "host_bw": 50, "fabric_bw": 20}


@pytest.mark.parametrize("spec, hosts, storage, best", [
    # four ranks fit a leaf of four: the hosts' own links
    (LEAFSPINE, ["h1", "h5", "h9", "h2"], (), 50e6),
    # six do not: out of the rack at the uplinks' 20
    (LEAFSPINE, ["h1", "h2", "h3", "h4", "h5", "h6"], (), 20e6),
    # a fat-tree's edge holds two hosts: two ranks fit, four leave the rack
    (FATTREE, ["h1", "h5"], (), 50e6),
    (FATTREE, ["h1", "h2", "h3", "h4"], (), 20e6),
    # a storage host is no place for a rank: h2 stores, so h1's edge has one free host,
    # but other edges still have two
    (FATTREE, ["h1", "h3"], ("h2",), 50e6),
])
def test_the_best_placement_is_judged_by_racks(spec, hosts, storage, best) -> None:
    topo = describe(make_topology(spec))
    assert gpuwait.best_bottleneck_bps(topo, ring(hosts, storage)) == best


def test_rack_uplinks_are_the_links_out_of_a_rack_upwards() -> None:
    ls = gpuwait.rack_uplinks(describe(make_topology(LEAFSPINE)))
    assert ls == {(f"leaf{i}", f"spine{j}") for i in (1, 2, 3) for j in (1, 2)}
    ft = describe(make_topology(FATTREE))
    roles = {s["name"]: s["role"] for s in ft["switches"]}
    up = gpuwait.rack_uplinks(ft)
    assert len(up) == 16                      # 8 edges x 2 aggregation switches
    assert {(roles[a], roles[b]) for a, b in up} == {("edge", "agg")}
