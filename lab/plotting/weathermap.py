"""The weathermap: the run's topology drawn by tier, each directed link coloured by its mean
utilisation, drops and CE marks on the link, the hottest link labelled, and a group of flows
drawn as paths over it.

Why a picture of the fabric: "eight streams on one uplink while the other idles" is seen at
a glance on a map and has to be read out of a table otherwise. Everything comes from
result.json alone (``topology`` for the nodes, their tiers and the links; a section's
``links`` for the counters; its ``flows`` for the counted paths), so a result written before
the weathermap existed gets one too.

Why networkx: the graph (a ``MultiDiGraph``: two directions per cable, parallel cables such
as a border's two uplinks to one ISP) and the tiered layout (``multipartite_layout``) are
what it is made for, and its matplotlib drawing draws each direction and each parallel cable
as its own arc. It is imported by the draw function only, like matplotlib.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

from lab.analysis import pauses
from lab.plotting.plots import UTIL_CMAP, UTIL_LABEL, Skipped, Spec, spec_name, spec_title
from lab.plotting.sections import Section, dict_of, dicts_of, num

#: Tiers bottom to top: (rank, label). A node's tier is its role in the result's topology.
SWITCH_TIERS = {"leaf": (1, "leaves"), "edge": (1, "edge switches"),
                "agg": (2, "aggregation"), "spine": (3, "spines"), "core": (3, "core")}
HOST_TIERS = {"gateway": (4, "DC core router")}
HOST_TIER = (0, "hosts")
BORDER_TIER = (5, "border routers")
ISP_TIER = (6, "ISPs")
EXTERNAL_TIER = (7, "ISP hosts")
OTHER_TIER = (8, "other")
#: How far (layout units) an arc bends off the straight line at its middle: both directions
#: of a cable bend apart, each further parallel cable by one more step. In layout units, not
#: as a share of the length, so that a short cable between adjacent tiers (a border's
#: uplinks to an ISP) is as readable as a long diagonal one.
ARC_BULGE, ARC_STEP = 0.2, 0.3
#: Layout units: the width a tier is spread over, and the distance between two tiers.
MAP_WIDTH, TIER_GAP = 10.0, 1.6


@dataclass(frozen=True)
class Arc:
    """One direction of one cable: ``key`` tells parallel cables between a pair apart."""

    src: str
    dst: str
    key: int
    port: int | None            # the egress port at ``src``, where the topology says
    bw_mbps: float
    util_pct: float | None      # None: this direction has no counters (a host's egress)
    drops: int = 0
    ce: int = 0
    tx_bytes: int = 0
    paused_s: float = 0.0       # PFC held this direction's lossless class (pfcd's counter)


@dataclass
class Fabric:
    """Nodes by tier (bottom first, in drawing order within a tier) and cables."""

    tiers: list[tuple[int, str, list[str]]]
    cables: list[tuple[str, int | None, str, int | None, float]]   # a, a_port, b, b_port, bw


@dataclass
class FlowGroup:
    """Flows drawn as paths over the map, and what they are (for the legend)."""

    label: str
    paths: list[list[tuple[str, str, int | None]]] = field(default_factory=list)


def _natural(name: str) -> tuple[Any, ...]:
    """``h2`` before ``h10``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def fabric_of(result: dict[str, Any]) -> Fabric | None:
    """The nodes and cables of ``result["topology"]``, tiered by role; None without one.

    Tiers: hosts, leaves/edges, aggregation, spines/core; on a streaming edge the DC core
    router (the fabric's gateway), the routers in its AS (borders), the other routers
    (ISPs) and the hosts behind them.
    """
    topo = dict_of(result.get("topology"))
    switches, hosts = dicts_of(topo.get("switches")), dicts_of(topo.get("hosts"))
    if not switches and not hosts:
        return None
    rank: dict[str, tuple[int, str]] = {}
    for s in switches:
        rank[str(s.get("name"))] = SWITCH_TIERS.get(str(s.get("role")), (2, "switches"))
    for h in hosts:
        rank[str(h.get("name"))] = HOST_TIERS.get(str(h.get("role")), HOST_TIER)
    routers = dicts_of(topo.get("routers"))
    gateway_as = {r.get("asn") for r in routers if rank.get(str(r.get("name"))) ==
                  HOST_TIERS["gateway"]}
    for r in routers:
        name = str(r.get("name"))
        if name not in rank:
            rank[name] = BORDER_TIER if r.get("asn") in gateway_as else ISP_TIER
    for h in dicts_of(topo.get("external_hosts")):
        rank.setdefault(str(h.get("name")), EXTERNAL_TIER)
    cables = []
    for ln in dicts_of(topo.get("links")) + dicts_of(topo.get("router_links")):
        a, b = str(ln.get("a")), str(ln.get("b"))
        for n in (a, b):
            rank.setdefault(n, OTHER_TIER)
        a_port, b_port = ln.get("a_port"), ln.get("b_port")
        cables.append((a, a_port if isinstance(a_port, int) else None, b,
                       b_port if isinstance(b_port, int) else None,
                       num(ln.get("bw_mbps")) or 0.0))
    return Fabric(_ordered_tiers(rank, cables), cables)


def _ordered_tiers(rank: dict[str, tuple[int, str]],
                   cables: list[tuple[str, int | None, str, int | None, float]]
                   ) -> list[tuple[int, str, list[str]]]:
    """Tiers bottom first; the bottom one in name order, every other one above its
    neighbours below (their mean position), so that cables cross as little as they must."""
    by_rank: dict[int, tuple[str, list[str]]] = {}
    for name, (r, label) in rank.items():
        by_rank.setdefault(r, (label, []))[1].append(name)
    nbrs: dict[str, set[str]] = {}
    for a, _, b, _, _ in cables:
        nbrs.setdefault(a, set()).add(b)
        nbrs.setdefault(b, set()).add(a)
    placed: dict[str, float] = {}
    out = []
    for r in sorted(by_rank):
        label, names = by_rank[r]
        names.sort(key=_natural)

        def below(n: str) -> float:
            xs = [placed[m] for m in nbrs.get(n, ()) if m in placed]
            return sum(xs) / len(xs) if xs else float("inf")

        if placed:
            names.sort(key=below)        # stable: name order among equals
        for i, n in enumerate(names):
            placed[n] = (i + 0.5) / len(names)
        out.append((r, label, names))
    return out


def arcs_of(fabric: Fabric, links: list[dict[str, Any]]) -> list[Arc]:
    """Both directions of every cable, with the counters of the section's ``links`` entry
    for that egress port (matched by node and port, else by node and peer)."""
    by_port = {(str(ln.get("node")), ln.get("port")): ln for ln in links}
    seen: dict[frozenset[str], int] = {}
    dirs = []                       # (src, port, dst, key, bw) of every direction
    for a, a_port, b, b_port, bw in fabric.cables:
        key = seen.get(frozenset((a, b)), 0)
        seen[frozenset((a, b))] = key + 1
        dirs += [(a, a_port, b, key, bw), (b, b_port, a, key, bw)]
    # By port first, for every direction: a peer-only match must not take a parallel
    # cable's entry before that cable is reached.
    entry = {i: by_port.get((src, port)) for i, (src, port, _, _, _) in enumerate(dirs)
             if port is not None}
    used = {id(ln) for ln in entry.values() if ln is not None}
    spare: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for ln in links:
        if id(ln) not in used:
            spare.setdefault((str(ln.get("node")), str(ln.get("peer"))), []).append(ln)
    arcs = []
    for i, (src, port, dst, key, bw) in enumerate(dirs):
        ln = entry.get(i)
        if ln is None and spare.get((src, dst)):
            ln = spare[(src, dst)].pop(0)
        util = None
        if ln is not None:
            u = num(ln.get("util_mean"))
            util = 100 * u if u is not None else None
        ln = ln or {}
        arcs.append(Arc(src, dst, key, port, num(ln.get("bw_mbps")) or bw, util,
                        int(num(ln.get("drops")) or 0), int(num(ln.get("ce_marked")) or 0),
                        int(num(ln.get("tx_bytes")) or 0)))
    return arcs


def with_pauses(arcs: list[Arc], details: dict[str, Any]) -> list[Arc]:
    """The arcs with the time PFC paused each one's egress port (``details["pfc"]``: pfcd's
    counters for the lossless priority, kept in a phase's details by kinds that run PFC)."""
    paused = {d: ns / 1e9 for d, ns in pauses.paused_ns(details.get("pfc")).items() if ns}
    if not paused:
        return arcs
    return [replace(a, paused_s=paused.get(f"{a.src}-eth{a.port}", 0.0))
            if a.port is not None else a for a in arcs]


def _heat(a: Arc) -> tuple[float, float]:
    """Mean utilisation, then bytes for the rate: ``util_mean`` is rounded, the bytes are not."""
    return (a.util_pct or 0.0, a.tx_bytes / a.bw_mbps if a.bw_mbps else 0.0)


def hottest(arcs: list[Arc]) -> Arc | None:
    """The measured direction with the highest mean utilisation (None if none sent)."""
    measured = [a for a in arcs if a.util_pct is not None]
    top = max(measured, key=_heat, default=None)
    return top if top is not None and (top.util_pct or 0) > 0 else None


def as_hot(arcs: list[Arc], top: Arc) -> list[Arc]:
    """Other directions exactly as hot as ``top``: the same bytes for the same rate (a ring's
    flow crosses two links of its path with every byte)."""
    return [a for a in arcs if a is not top and a.util_pct is not None
            and _heat(a) == _heat(top)]


def flow_nodes(flow: dict[str, Any]) -> list[str]:
    """The nodes a flow's packets crossed, host to host: its counted ``path`` (switches), or
    its ``full_path`` (routers and switches) where the result has one, between its source and
    destination."""
    full = flow.get("full_path")
    path = full if isinstance(full, list) and full else flow.get("path")
    nodes = [str(n) for n in path] if isinstance(path, list) else []
    src, dst = str(flow.get("src", "?")), str(flow.get("dst", "?"))
    return ([src] if nodes[:1] != [src] else []) + nodes + ([dst] if nodes[-1:] != [dst] else [])


def flow_hops(flow: dict[str, Any]) -> list[tuple[str, str, int | None]]:
    """(from, to, egress port) of every hop of ``flow``; the port where the result names the
    cable (a router hop ``isp1-eth0->border1-eth2``), else None (any cable of the pair)."""
    ports: dict[tuple[str, str], int] = {}
    for hop in dicts_of(flow.get("router_hops")):
        m = re.match(r"(.+)-eth(\d+)->", str(hop.get("link", "")))
        if m and m.group(1) == hop.get("from"):
            ports[(str(hop.get("from")), str(hop.get("to")))] = int(m.group(2))
    nodes = flow_nodes(flow)
    return [(u, v, ports.get((u, v))) for u, v in itertools.pairwise(nodes)]


def _crosses(flow: dict[str, Any], arc: Arc) -> bool:
    return any((u, v) == (arc.src, arc.dst) and port in (None, arc.port)
               for u, v, port in flow_hops(flow))


def default_group(sec: Section, arcs: list[Arc]) -> FlowGroup | None:
    """The flows a section's map shows as paths: the streams that stalled; else the ring
    epoch (all its connections) that first crossed the hottest link; else the flows that
    crossed the hottest link."""
    stalled = [f for f in sec.flows if (num(f.get("stalls")) or 0) > 0]
    if stalled:
        return FlowGroup(f"stalled streams ({len(stalled)})", [flow_hops(f) for f in stalled])
    top = hottest(arcs)
    if top is None:
        return None
    through = [f for f in sec.flows if _crosses(f, top)]
    epochs = sorted(e for f in through if isinstance(e := f.get("epoch"), int))
    if epochs:
        ring = [f for f in sec.flows if f.get("epoch") == epochs[0]]
        return FlowGroup(f"ring epoch {epochs[0]} ({len(ring)} connections)",
                         [flow_hops(f) for f in ring])
    if through:
        return FlowGroup(f"flows through the hottest link ({len(through)})",
                         [flow_hops(f) for f in through])
    return None


def flow_group(sec: Section, ids: list[str], label: str | None = None) -> FlowGroup:
    """The flows of ``sec`` named by ``ids`` (with or without their phase prefix)."""
    want = set(ids)
    chosen = [f for f in sec.flows
              if str(f.get("id")) in want or str(f.get("id")).rsplit("/", 1)[-1] in want]
    return FlowGroup(label or ", ".join(ids), [flow_hops(f) for f in chosen])


def _link_name(arc: Arc, arcs: list[Arc]) -> str:
    parallel = sum(1 for a in arcs if (a.src, a.dst) == (arc.src, arc.dst)) > 1
    return f"{arc.src}→{arc.dst}" + (f" (cable {arc.key + 1})" if parallel else "")


def weathermap_spec(sec: Section, result: dict[str, Any],
                    group: FlowGroup | None = None) -> Spec | Skipped:
    """The section's weathermap; ``group`` is drawn as paths (default: ``default_group``).

    ``vmax`` is the highest mean utilisation in %: the colour scale runs from 0 to at least
    100 %, so two runs compared get one scale.
    """
    name = spec_name("weathermap", sec)
    if importlib.util.find_spec("networkx") is None:
        # A venv installed before the lab needed it: the other plots are still made.
        return Skipped(name, "networkx is not installed (`pip install -e .` installs it)")
    fabric = fabric_of(result)
    if fabric is None:
        return Skipped(name, "the result has no topology to draw")
    if not fabric.cables:
        return Skipped(name, "the result's topology has no links")
    arcs = with_pauses(arcs_of(fabric, sec.links), sec.details)
    measured = [a for a in arcs if a.util_pct is not None]
    if not measured:
        return Skipped(name, f"{sec.label}: no link has counters")
    group = group if group is not None else default_group(sec, arcs)
    top = hottest(arcs)
    vmax = max(a.util_pct or 0.0 for a in measured)
    title = spec_title("Weathermap: mean utilisation of every link", sec)
    drops = sum(a.drops for a in arcs)
    marks = sum(a.ce for a in arcs)
    tied = as_hot(arcs, top) if top else []
    paused = [f"{_link_name(a, arcs)} {a.paused_s:.2f} s"
              for a in sorted(arcs, key=lambda x: -x.paused_s) if a.paused_s]
    top_text = (f"{_link_name(top, arcs)} at {top.util_pct:.0f} % mean"
                + (f" (as hot: {', '.join(_link_name(a, arcs) for a in tied)})" if tied else "")
                if top else "no link sent anything")

    # A fabric split over machines: the links that are tunnels between them.
    tunnels = {(t["node"], t["peer"]) for t in result.get("cluster", {}).get("tunnels", [])}

    def draw(fig: Any, limit: float) -> str:
        scale = max(100.0, limit)
        _draw_map(fig, fabric, arcs, top, group, scale, title, tunnels)
        where = [f"{_link_name(a, arcs)} {a.drops:,}" for a in arcs if a.drops]
        return ("The fabric by tier, each direction of each cable an arrow coloured by its "
                "mean utilisation over the "
                f"{sec.label} (width by link rate; grey dashed: a direction with no "
                "counters, a host's own sending). Look for one hot arrow beside cool "
                "siblings: load the hash put on one link. "
                f"Colour scale 0–{scale:.0f} %. "
                f"Hottest: {top_text}. "
                + (f"Drops: {drops:,} ({'; '.join(where[:4])}"
                   f"{', …' if len(where) > 4 else ''}). " if drops else "No drops. ")
                + (f"CE marks: {marks:,}. " if marks else "")
                + (f"PFC paused {len(paused)} ports' lossless class (pause sign, seconds): "
                   f"{'; '.join(paused[:4])}{', …' if len(paused) > 4 else ''}. "
                   if paused else "")
                + (f"Dotted blue: the {len(tunnels)} directions that are tunnels between "
                   "machines. " if tunnels else "")
                + (f"Drawn as paths: {group.label}." if group and group.paths else
                   "No flow group drawn."))

    height = min(10.0, 1.6 + (len(fabric.tiers) * TIER_GAP + 0.4) / (MAP_WIDTH + 1.2) * 6.4)
    return Spec(name, "weathermap", sec.name, max(4.0, height), vmax, draw)


def positions(fabric: Fabric) -> dict[str, tuple[float, float]]:
    """networkx's tiered layout, each tier then spread over the map's width (a tier of two
    spines stands above the middle of its leaves, not huddled in the centre)."""
    import networkx as nx

    g = nx.Graph()
    layers = {i: nodes for i, (_, _, nodes) in enumerate(fabric.tiers)}
    for nodes in layers.values():
        g.add_nodes_from(nodes)
    pos = nx.multipartite_layout(g, subset_key=layers, align="horizontal")
    out: dict[str, tuple[float, float]] = {}
    for i, nodes in layers.items():
        xs = [float(pos[n][0]) for n in nodes]
        lo, hi = min(xs), max(xs)
        for n, x in zip(nodes, xs, strict=True):
            # multipartite spaces a tier's nodes evenly: map them onto equal slots.
            slot = (x - lo) / (hi - lo) * (len(nodes) - 1) if hi > lo else 0.0
            out[n] = ((slot + 0.5) / len(nodes) * MAP_WIDTH, i * TIER_GAP)
    return out


def arc_rad(a: Arc, pos: dict[str, tuple[float, float]]) -> float:
    """matplotlib's ``arc3`` curvature (a share of the arc's length) that bends ``a`` off the
    straight line by its bulge in layout units."""
    (xa, ya), (xb, yb) = pos[a.src], pos[a.dst]
    length = math.hypot(xb - xa, yb - ya) or 1.0
    return round(min(1.5, 2 * (ARC_BULGE + ARC_STEP * a.key) / length), 3)


def _mid(pa: tuple[float, float], pb: tuple[float, float], rad: float) -> tuple[float, float]:
    """The middle of matplotlib's ``arc3`` curve from ``pa`` to ``pb`` (equal aspect)."""
    dx, dy = pb[0] - pa[0], pb[1] - pa[1]
    return ((pa[0] + pb[0]) / 2 + rad * dy / 2, (pa[1] + pb[1]) / 2 - rad * dx / 2)


def _draw_map(fig: Any, fabric: Fabric, arcs: list[Arc], top: Arc | None,
              group: FlowGroup | None, vmax: float, title: str,
              tunnels: set[tuple[str, str]] = frozenset()) -> None:  # type: ignore[assignment]
    """The map on ``fig``: arcs coloured by utilisation (the hottest outlined, a flow
    group's path haloed, tunnels between machines dotted), nodes by tier, drop and CE
    marks, the hottest link named, then the frame (tiers, colour bar, legend)."""
    import networkx as nx
    from matplotlib import colormaps
    from matplotlib.colors import Normalize
    from matplotlib.lines import Line2D

    ax = fig.add_subplot()
    pos = positions(fabric)
    g = nx.MultiDiGraph()
    g.add_nodes_from(pos)
    for a in arcs:
        g.add_edge(a.src, a.dst, key=a.key)
    cmap, norm = colormaps[UTIL_CMAP], Normalize(0.0, vmax)
    bw_max = max((a.bw_mbps for a in arcs), default=1.0) or 1.0
    node_size = 620

    def width(a: Arc) -> float:
        return 1.2 + 2.8 * a.bw_mbps / bw_max

    def draw_arcs(subset: list[Arc], widths: list[float], colours: list[Any],
                  **kw: Any) -> None:
        """networkx's arcs, one call per curvature (its ``connectionstyle`` is per call)."""
        by_rad: dict[float, list[tuple[Arc, float, Any]]] = {}
        for a, w, c in zip(subset, widths, colours, strict=True):
            by_rad.setdefault(arc_rad(a, pos), []).append((a, w, c))
        for rad, items in by_rad.items():
            nx.draw_networkx_edges(g, pos, edgelist=[(a.src, a.dst, a.key) for a, _, _ in items],
                                   width=[w for _, w, _ in items],
                                   edge_color=[c for _, _, c in items], ax=ax, arrows=True,
                                   node_size=node_size, hide_ticks=False,
                                   connectionstyle=f"arc3,rad={rad}", **kw)

    handles: list[Any] = []
    if group and group.paths:
        on_path = {hop for p in group.paths for hop in p}
        halo = [a for a in arcs if {(a.src, a.dst, None), (a.src, a.dst, a.port)} & on_path]
        if halo:
            draw_arcs(halo, [11.0] * len(halo), ["#ff00cc"] * len(halo), alpha=0.28,
                      arrowstyle="-")
            handles.append(Line2D([], [], color="#ff00cc", lw=6, alpha=0.4,
                                  label=f"path: {group.label}"))
    if top is not None:
        draw_arcs([top], [width(top) + 4], ["black"], arrowsize=16, arrowstyle="-|>")
    cut = [a for a in arcs if (a.src, a.dst) in tunnels]
    if cut:
        draw_arcs(cut, [width(a) + 5 for a in cut], ["#1f4fbf"] * len(cut), style="dotted",
                  alpha=0.7, arrowstyle="-")
        handles.append(Line2D([], [], color="#1f4fbf", ls=":", lw=3, label="tunnel"))
    idle = [a for a in arcs if a.util_pct is None]
    if idle:
        draw_arcs(idle, [0.8] * len(idle), ["#aaaaaa"] * len(idle), style="dashed",
                  arrowsize=7, arrowstyle="-|>")
        handles.append(Line2D([], [], color="#aaaaaa", ls="--", label="no counters"))
    hot = [a for a in arcs if a.util_pct is not None]
    draw_arcs(hot, [width(a) for a in hot], [cmap(norm(a.util_pct or 0.0)) for a in hot],
              arrowsize=10, arrowstyle="-|>")
    shapes = {0: "o", 7: "o"}
    for rank, _, nodes in fabric.tiers:
        nx.draw_networkx_nodes(g, pos, nodelist=nodes, node_size=node_size, ax=ax,
                               node_shape=shapes.get(rank, "s" if rank <= 3 else "h"),
                               node_color="#f2f2f2", edgecolors="#444444", linewidths=1.0,
                               hide_ticks=False)
    nx.draw_networkx_labels(g, pos, font_size=6, ax=ax, hide_ticks=False)
    handles += _mark_drops_and_ce(ax, arcs, pos)
    if top is not None:
        handles.append(_name_hottest(ax, top, arcs, pos))
    _frame(fig, ax, fabric, norm, cmap, vmax, title, handles)


def _mark_drops_and_ce(ax: Any, arcs: list[Arc],
                       pos: dict[str, tuple[float, float]]) -> list[Any]:
    """A cross with the count on every arc that dropped, a diamond on every one that
    marked CE, a pause sign with the seconds on every one PFC paused; their legend
    entries."""
    from matplotlib.lines import Line2D
    handles: list[Any] = []
    for a in arcs:
        if not (a.drops or a.ce):
            continue
        x, y = _mid(pos[a.src], pos[a.dst], arc_rad(a, pos))
        if a.drops:
            ax.plot([x], [y], marker="X", ms=9, color="#d00000", mec="white", mew=0.8,
                    zorder=5)
            ax.annotate(f"{a.drops:,}", (x, y), xytext=(5, 3), textcoords="offset points",
                        fontsize=6.5, color="#d00000", zorder=6)
        if a.ce:
            ax.plot([x], [y], marker="D", ms=6, color="#ff8c00", mec="white", mew=0.6,
                    zorder=5)
            ax.annotate(f"{a.ce:,} CE", (x, y), xytext=(5, -8), textcoords="offset points",
                        fontsize=6.5, color="#a65c00", zorder=6)
    for a in arcs:
        if a.paused_s:
            x, y = _mid(pos[a.src], pos[a.dst], arc_rad(a, pos))
            ax.plot([x], [y], marker="$\u2016$", ms=9, color="#6a1b9a", zorder=5)
            ax.annotate(f"{a.paused_s:.1f} s", (x, y), xytext=(-22, 3),
                        textcoords="offset points", fontsize=6.5, color="#6a1b9a", zorder=6)
    if any(a.paused_s for a in arcs):
        handles.append(Line2D([], [], marker="$\u2016$", ls="", color="#6a1b9a",
                              label="PFC paused (s)"))
    if any(a.drops for a in arcs):
        handles.append(Line2D([], [], marker="X", ls="", color="#d00000",
                              label="drops (count)"))
    if any(a.ce for a in arcs):
        handles.append(Line2D([], [], marker="D", ls="", color="#ff8c00",
                              label="CE marks (count)"))
    return handles


def _name_hottest(ax: Any, top: Arc, arcs: list[Arc],
                  pos: dict[str, tuple[float, float]]) -> Any:
    """The hottest link's name and utilisation beside its arc; its legend entry."""
    from matplotlib.lines import Line2D
    x, y = _mid(pos[top.src], pos[top.dst], arc_rad(top, pos))
    ax.annotate(f"hottest: {_link_name(top, arcs)} {top.util_pct:.0f} %", (x, y),
                # Beside the arc, towards the map's middle: above it would hide a
                # short arc between two adjacent tiers.
                xytext=(60 if x < MAP_WIDTH / 2 else -60, 12), textcoords="offset points",
                ha="left" if x < MAP_WIDTH / 2 else "right", fontsize=8,
                fontweight="bold", zorder=7,
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "black",
                      "lw": 0.8},
                arrowprops={"arrowstyle": "-", "color": "black", "lw": 0.8})
    return Line2D([], [], color="black", lw=4, label="hottest link")


def _frame(fig: Any, ax: Any, fabric: Fabric, norm: Any, cmap: Any, vmax: float, title: str,
           handles: list[Any]) -> None:
    """Tiers named on the y axis, no x axis, the title, the colour bar, the legend."""
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlim(-0.6, MAP_WIDTH + 0.6)
    ax.set_ylim(-0.7, (len(fabric.tiers) - 1) * TIER_GAP + 0.7)
    ax.set_yticks([i * TIER_GAP for i in range(len(fabric.tiers))])
    ax.set_yticklabels([label for _, label, _ in fabric.tiers], fontsize=8)
    ax.set_xticks([])
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="y", length=0)
    ax.set_title(title)
    ax.set_xlabel("nodes of a tier, each above its neighbours in the tier below")
    ax.set_ylabel("tier")
    from matplotlib.cm import ScalarMappable
    cb = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, shrink=0.8,
                      extend="max" if vmax > 100 else "neither")
    cb.set_label(UTIL_LABEL)
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.06),
                  ncol=min(4, len(handles)), frameon=False)
