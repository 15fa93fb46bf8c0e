"""A flow's path, read from the switches' own per-flow counters, not from the policy's intent.

Every switch holds a counter entry for each watched 5-tuple; the switches whose counter moved
are the ones the flow's packets crossed. Ordered along the topology from the switch the
source host hangs off, they are the path: in a leaf-spine or fat-tree each pair of adjacent
switches shares exactly one link, so the switch sequence fixes the uplink at every hop.
"""

from __future__ import annotations


def adjacency(topo_desc: dict) -> dict[str, dict[str, int]]:
    """{switch: {neighbour switch: local port}} for switch-to-switch links."""
    switches = {s["name"] for s in topo_desc["switches"]}
    adj: dict[str, dict[str, int]] = {s: {} for s in switches}
    for link in topo_desc["links"]:
        a, b = link["a"], link["b"]
        if a in switches and b in switches:
            adj[a][b] = link["a_port"]
            adj[b][a] = link["b_port"]
    return adj


def attachment(topo_desc: dict) -> dict[str, str]:
    """{host: the switch it is attached to}."""
    switches = {s["name"] for s in topo_desc["switches"]}
    att = {}
    for link in topo_desc["links"]:
        a, b = link["a"], link["b"]
        if a in switches and b not in switches:
            att[b] = a
        elif b in switches and a not in switches:
            att[a] = b
    return att


def path_from_counters(hop_bytes: dict[str, int], first: str,
                       adj: dict[str, dict[str, int]]) -> tuple[list[str], bool]:
    """Order the switches that counted the flow into a path starting at ``first``.

    Returns (path, clean). ``clean`` is False when the counted switches do not form one
    simple path (the flow moved mid-run, or was split): the path then lists every counted
    switch in walk order and the caller flags it.
    """
    counted = {sw for sw, b in hop_bytes.items() if b > 0}
    if not counted:
        return [], True
    path: list[str] = []
    split = False
    current = first if first in counted else None
    while current is not None:
        path.append(current)
        nxt = [n for n in adj.get(current, {}) if n in counted and n not in path]
        current = nxt[0] if len(nxt) == 1 else None
        if len(nxt) > 1:
            split = True
            path.extend(sorted(nxt))
            break
    clean = not split and set(path) == counted
    if not clean:
        path += sorted(counted - set(path))
    return path, clean


def link_bytes(hop_bytes: dict[str, int], first: str,
               adj: dict[str, dict[str, int]]) -> dict[tuple[str, str], tuple[int, int]]:
    """{(a, b): (entered, arrived)} for each link a flow's counted switches share.

    ``entered`` is what switch ``a`` counted of the flow that went on towards ``b``,
    ``arrived`` what ``b`` counted that came from ``a``. On one simple path they are just
    the two switches' counts. A flow whose counters show two paths needs this, not a walk
    along its ``path`` list: there a switch's count is split between its next hops (and a
    switch's between its previous hops) in proportion to what those counted, which is
    exact for the split a leaf-spine fabric can show (one leaf, both spines, the other leaf).
    Captured on OVS's kernel datapath under ``ovs-select``: one socketless RST (54 B) of a flow's
    ACK direction on the other spine; walking the list [leaf2, spine1, spine2, leaf1] put the
    whole flow's ACK bytes on spine2's link to leaf1, which they never crossed.
    """
    counted = {sw for sw, b in hop_bytes.items() if b > 0}
    if first not in counted:
        return {}
    # Layers by hop count from the first switch, over the switches that counted the flow:
    # a flow's packets only move away from where they entered.
    depth = {first: 0}
    frontier = [first]
    while frontier:
        nxt = []
        for sw in frontier:
            for n in sorted(adj.get(sw, {})):
                if n in counted and n not in depth:
                    depth[n] = depth[sw] + 1
                    nxt.append(n)
        frontier = nxt
    edges = [(a, b) for a in depth for b in adj.get(a, {})
             if b in depth and depth[b] == depth[a] + 1]
    out_sum: dict[str, int] = {}
    in_sum: dict[str, int] = {}
    for a, b in edges:
        out_sum[a] = out_sum.get(a, 0) + hop_bytes[b]
        in_sum[b] = in_sum.get(b, 0) + hop_bytes[a]
    return {(a, b): (round(hop_bytes[a] * hop_bytes[b] / out_sum[a]),
                     round(hop_bytes[b] * hop_bytes[a] / in_sum[b])) for a, b in edges}
