"""PFC's pauses read from a run: which port's queue started them, how far upstream they
spread, and which flows they held.

Switches count PFC per port and priority: PAUSE frames sent (the port's queue passed XOFF)
and received (the port was told to stop), time paused. A port that sent PAUSE and never
received one is a root: its own egress was congested. A paused port hangs under the
watched port it feeds (``feeds``: watched port -> its feeders, as PFC was configured), one
hop further up. A flow whose path crosses a paused port and not the root is a victim of
head-of-line blocking: it waited for congestion that was not on its path. Shared by every
kind that runs PFC and by ``fabriclab diagnose``.
"""

from __future__ import annotations

import itertools
from typing import Any

from controllers.classes import LOSSLESS_PRIORITY
from lab.model.flowpaths import adjacency
from lab.model.flows import ROCE_UDP_PORT

#: The 802.1p priority PFC is read on: the lossless class's, as pfcd's JSON keys it.
PRIORITY = str(LOSSLESS_PRIORITY)


def lossless_counters(pfc: Any) -> dict[str, dict[str, Any]]:
    """{port: pfcd's counters for the lossless priority} (``pfc``: pfcd's JSON, None when
    PFC did not run). The one reader of that JSON's shape: the kind's metrics, its plots
    and the weathermap go through it, and a result file of another shape reads as no
    counters rather than an error (the report draws what it can)."""
    ports = pfc.get("ports") if isinstance(pfc, dict) else None
    out: dict[str, dict[str, Any]] = {}
    for p in ports if isinstance(ports, list) else []:
        if isinstance(p, dict):
            prio = p.get("priorities")
            c = prio.get(PRIORITY) if isinstance(prio, dict) else None
            out[str(p.get("dev"))] = c if isinstance(c, dict) else {}
    return out


def paused_ns(pfc: Any) -> dict[str, int]:
    """{port: nanoseconds its lossless class was held} for every port PFC paused (it
    received PAUSE), in port order."""
    return {d: int(c.get("paused_ns") or 0) for d, c in sorted(lossless_counters(pfc).items())
            if c.get("pause_frames_rx")}


def pause_tree(pfc: dict[str, Any] | None, feeds: dict[str, list[str]]) -> dict[str, Any]:
    """{roots, hops (port -> hops from its root), max_hops, paused_ns (paused ports)} from
    pfcd's counters (``pfc``, None when PFC did not run); every port by its device name."""
    if not pfc:
        return {"roots": [], "hops": {}, "paused_ns": {}, "max_hops": 0}
    held = paused_ns(pfc)
    sent = {d for d, c in lossless_counters(pfc).items() if c.get("pause_frames_tx")}
    paused = set(held)
    roots = sorted(sent - paused)
    hops: dict[str, int] = {r: 0 for r in roots}
    frontier = list(roots)
    while frontier:
        upstream = []
        for dev in frontier:
            for f in feeds.get(dev, []):
                if f in paused and f not in hops:
                    hops[f] = hops[dev] + 1
                    upstream.append(f)
        frontier = upstream
    return {"roots": roots, "hops": hops, "max_hops": max(hops.values(), default=0),
            "paused_ns": held}


def flow_ports(flow: dict[str, Any], topo: dict[str, Any]) -> list[str]:
    """The egress ports a flow's packets left through, in order: the sender's NIC, each
    switch's port towards the next switch on the flow's counted path, the last switch's
    port towards the receiver."""
    adj = adjacency(topo)
    to_host = {(ln["b"], ln["a"]): ln["b_port"] for ln in topo["links"]}
    nic = {ln["a"]: ln["a_port"] for ln in topo["links"]}
    path = flow.get("path") or []
    if not path:
        return []
    ports = [f"{flow['src']}-eth{nic.get(flow['src'], 0)}"]
    ports += [f"{a}-eth{adj[a][b]}" for a, b in itertools.pairwise(path)]
    last = to_host.get((path[-1], flow["dst"]))
    return ports + ([f"{path[-1]}-eth{last}"] if last is not None else [])


def explain(pfc: dict[str, Any] | None, feeds: dict[str, list[str]],
            flows: list[dict[str, Any]], topo: dict[str, Any]) -> dict[str, Any]:
    """The pause tree and, per lossless (RoCE) flow, the paused ports it crossed and whether
    it crossed a root (its own congestion) or only ports paused for someone else's (a
    victim)."""
    tree = pause_tree(pfc, feeds)
    if not tree["roots"]:
        return {**tree, "flows": {}, "victims": []}
    held = {}
    # a pause holds the lossless priority only: RoCE's flows; TCP beside them is not held
    for f in (f for f in flows if f.get("proto") == "udp" and f.get("dport") == ROCE_UDP_PORT):
        ports = flow_ports(f, topo)
        crossed = [p for p in ports if p in tree["paused_ns"]]
        held[f["id"]] = {"paused_ports": crossed,
                         "roots": [p for p in ports if p in tree["roots"]]}
    victims = sorted(i for i, h in held.items() if h["paused_ports"] and not h["roots"])
    return {**tree, "flows": held, "victims": victims}


def render(p: dict[str, Any]) -> list[str]:
    """The pauses as an operator reads them (nothing when no port paused)."""
    if not p or not p.get("roots"):
        return []
    lines = [f"pauses: root {', '.join(p['roots'])} (its queue passed XOFF and it was never "
             f"paused itself); they spread {p['max_hops']} hops upstream"]
    by_hop = sorted(p["hops"].items(), key=lambda kv: (kv[1], kv[0]))
    lines += [f"  hop {h}: {dev}, paused {p['paused_ns'].get(dev, 0) / 1e9:.2f} s"
              for dev, h in by_hop if h]
    if p["victims"]:
        lines.append("held by pauses without crossing the root (head-of-line blocking): "
                     + ", ".join(f"{v} at {', '.join(p['flows'][v]['paused_ports'])}"
                                 for v in p["victims"]))
    return lines
