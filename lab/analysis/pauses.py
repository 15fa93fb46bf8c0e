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

from controllers.classes import LOSSLESS_LEAF, LOSSLESS_PRIORITY, LOSSY_LEAF
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
    return _held_ns(lossless_counters(pfc))


def _held_ns(counters: dict[str, dict[str, Any]]) -> dict[str, int]:
    return {d: int(c.get("paused_ns") or 0) for d, c in sorted(counters.items())
            if c.get("pause_frames_rx")}


def pause_tree(pfc: dict[str, Any] | None, feeds: dict[str, list[str]]) -> dict[str, Any]:
    """{roots (most PAUSE frames sent first), hops (port -> hops from its root), max_hops,
    paused_ns (paused ports), root_frames (PAUSE frames each root sent)} from pfcd's
    counters (``pfc``, None when PFC did not run); every port by its device name."""
    if not pfc:
        return {"roots": [], "hops": {}, "paused_ns": {}, "max_hops": 0, "root_frames": {}}
    counters = lossless_counters(pfc)
    held = _held_ns(counters)
    sent = {d: int(c["pause_frames_tx"]) for d, c in counters.items()
            if c.get("pause_frames_tx")}
    paused = set(held)
    # the root that sent most PAUSE first: the congested port the pauses spread from, before
    # a port whose queue passed XOFF once, filled by a burst let go when a pause ended
    roots = sorted(set(sent) - paused, key=lambda d: (-sent[d], d))
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
            "paused_ns": held, "root_frames": {r: sent[r] for r in roots}}


def class_drops(classes: dict[str, dict[str, dict[str, int]]], leaf: str) -> dict[str, int]:
    """{port: drops} of one class's leaf, for ports that dropped."""
    return {dev: c[leaf]["drops"] for dev, c in classes.items()
            if leaf in c and c[leaf]["drops"]}


def summary(classes: dict[str, Any], pfc: dict[str, Any] | None,
            feeds: dict[str, list[str]]) -> dict[str, Any]:
    """A phase's lossless fabric in numbers, the same for every kind that runs it: each
    class's drops (the lossless class's must be 0 under PFC), the seconds and frames of
    pause, and the pause tree. ``classes``: each port's per-leaf counts over the phase
    (``lab.measure.classes``); ``pfc``: pfcd's counters (None without PFC)."""
    lossless = class_drops(classes, LOSSLESS_LEAF)
    tree = pause_tree(pfc, feeds)
    return {"lossless_drops": sum(lossless.values()), "lossless_drops_by_port": lossless,
            "lossy_drops": sum(class_drops(classes, LOSSY_LEAF).values()),
            "pause_time_s": round(sum(tree["paused_ns"].values()) / 1e9, 4),
            "pause_frames": sum(c.get("pause_frames_tx", 0)
                                for c in lossless_counters(pfc).values()),
            "pause_tree": tree}


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
    for f in (f for f in flows if is_roce(f)):
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


def is_roce(flow: dict[str, Any]) -> bool:
    """A RoCEv2 flow, from its 5-tuple: the only traffic PFC's lossless priority holds."""
    return flow.get("proto") == "udp" and flow.get("dport") == ROCE_UDP_PORT


def held(pfc: dict[str, Any] | None, feeds: dict[str, list[str]], flows: list[dict[str, Any]],
         topo: dict[str, Any], duration_s: float) -> dict[str, Any] | None:
    """What PFC did to some flows (a job's) in a phase (:func:`explain` over their RoCE
    ones): the roots (most PAUSE sent first) and their frames, the paused ports on the
    flows' paths with seconds paused and hops from a root, the roots they crossed, whether
    they crossed the main root, and ``held_share``, the longest of those pauses over the
    phase's duration (a ring waits for its slowest hop). None when PFC did not run or no
    flow is RoCE."""
    # numbered here: explain keys flows by id, which a flow record need not carry
    roce = [{**f, "id": str(i)} for i, f in enumerate(flows) if is_roce(f)]
    if not pfc or not roce:
        return None
    p = explain(pfc, feeds, roce, topo)
    on = p["flows"].values()
    ports = sorted({port for h in on for port in h["paused_ports"]})
    crossed = sorted({r for h in on for r in h["roots"]})
    longest = max((p["paused_ns"][port] for port in ports), default=0) / 1e9
    return {"roots": p["roots"], "root_frames": p["root_frames"], "crossed_roots": crossed,
            "crossed_root": bool(p["roots"]) and p["roots"][0] in crossed,
            "job_paused_ports": {port: round(p["paused_ns"][port] / 1e9, 3) for port in ports},
            "hops": {port: p["hops"][port] for port in ports if port in p["hops"]},
            "held_share": round(longest / duration_s, 4) if duration_s else 0.0}


def held_text(paused: dict[str, Any] | None, duration_s: float) -> str:
    """:func:`held` as an operator reads it: how long PFC held the paths, the roots, the
    paused ports on the paths, and whether the flows crossed the main root."""
    if not paused or not paused["job_paused_ports"]:
        return "PFC paused no port on the job's paths"
    main, *minor = paused["roots"]
    frames = paused.get("root_frames") or {}
    roots = f"{main} ({frames.get(main, 0)} PAUSE frames sent)" + (
        "; also " + ", ".join(f"{r} ({frames.get(r, 0)})" for r in minor) if minor else "")
    on_path = ", ".join(
        f"{port} {s:.2f} s (" + (f"hop {paused['hops'][port]}" if port in paused["hops"]
                                 else "under no root") + ")"
        for port, s in paused["job_paused_ports"].items())
    whose = (f"the job's flows cross {main}: its own traffic is in the congested queue"
             if paused["crossed_root"] else
             f"none of the job's flows crosses {main}: head-of-line blocking")
    return (f"PFC held the job's paths {paused['held_share'] * 100:.0f}% of the "
            f"{duration_s:g} s phase; the pauses started at {roots} (a queue past XOFF, "
            f"never paused itself); paused on the job's paths: {on_path}; {whose}")
