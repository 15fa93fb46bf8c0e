"""Shortest-path ECMP candidates: for each switch and host, the ports that lead closer.

A pure function of the topology so that it can be checked on any fabric without a switch:
BFS from each host's switch over the switch graph gives every switch its hop distance to
that host, and a port is a candidate exactly when the neighbour behind it is one hop
closer. Nothing here knows about tiers, so leaf-spine, fat-tree and anything else with
equal-cost paths get the same treatment (a fat-tree edge switch gets its 2 up-ports, a core
switch its one down-port into the destination pod).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

#: {switch: {host: sorted candidate output ports}}
Routes = dict[str, dict[str, list[int]]]


def adjacency(topo: Mapping[str, Any]) -> dict[str, list[tuple[int, str]]]:
    """{switch: [(local port, neighbour switch)]}: parallel links stay separate entries."""
    adj: dict[str, list[tuple[int, str]]] = {s["name"]: [] for s in topo["switches"]}
    for link in topo["links"]:
        adj[link["a"]].append((link["a_port"], link["b"]))
        adj[link["b"]].append((link["b_port"], link["a"]))
    return adj


def distances(adj: Mapping[str, list[tuple[int, str]]], origin: str) -> dict[str, int]:
    """Hop count from every reachable switch to ``origin`` (links are bidirectional)."""
    dist = {origin: 0}
    queue = deque([origin])
    while queue:
        here = queue.popleft()
        for _, peer in adj[here]:
            if peer not in dist:
                dist[peer] = dist[here] + 1
                queue.append(peer)
    return dist


def ecmp_routes(topo: Mapping[str, Any]) -> Routes:
    """Candidates for every (switch, host). Unreachable pairs get no entry at all.

    ``topo`` is the controller config's shape: ``switches`` [{name}], ``hosts`` [{name,
    switch, port}], ``links`` [{a, a_port, b, b_port}] (switch-to-switch only).
    """
    adj = adjacency(topo)
    routes: Routes = {name: {} for name in adj}
    dist_cache: dict[str, dict[str, int]] = {}
    for host in topo["hosts"]:
        home = host["switch"]
        if home not in dist_cache:
            dist_cache[home] = distances(adj, home)
        dist = dist_cache[home]
        for sw, links in adj.items():
            if sw == home:
                routes[sw][host["name"]] = [host["port"]]
            elif sw in dist:
                closer = sorted({port for port, peer in links if dist[peer] == dist[sw] - 1})
                routes[sw][host["name"]] = closer
    return routes
