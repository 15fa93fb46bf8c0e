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
