"""What a topology description (``topologies.describe``: switches, hosts, links as data)
says about itself: edge switches, the hosts under one, its uplink capacity. Pure functions
of the description, shared by every kind that places traffic on a fabric.
"""

from __future__ import annotations

from lab.model.errors import ScenarioError


def edge_switches(topo_desc: dict) -> list[str]:
    """The switches hosts attach to, in name order (leaves, or fat-tree edges)."""
    role = "leaf" if topo_desc["type"] == "leafspine" else "edge"
    names = [s["name"] for s in topo_desc["switches"] if s["role"] == role]
    return sorted(names, key=lambda n: int(n[len(role):]))


def hosts_of(topo_desc: dict, switch: str) -> list[str]:
    hosts = {h["name"] for h in topo_desc["hosts"]}
    found = []
    for link in topo_desc["links"]:
        if link["b"] == switch and link["a"] in hosts:
            found.append(link["a"])
    return sorted(found, key=lambda n: int(n[1:]))


def uplink_capacity_bps(topo_desc: dict, switch: str) -> float:
    hosts = {h["name"] for h in topo_desc["hosts"]}
    return sum(link["bw_mbps"] * 1e6 for link in topo_desc["links"]
               if link["a"] == switch and link["b"] not in hosts)


def check_fabric(topo_desc: dict, kind: str, min_edges: int = 1) -> None:
    """Refuse a topology the kind cannot use: it places traffic on edge switches' hosts."""
    if topo_desc["type"] not in ("leafspine", "fattree"):
        raise ScenarioError("topology.type", f"the {kind} kind runs on leafspine or fattree "
                            f"topologies, not {topo_desc['type']}")
    if len(edge_switches(topo_desc)) < min_edges:
        raise ScenarioError("topology.leaves", f"the {kind} kind needs at least {min_edges} "
                            "leaves")
