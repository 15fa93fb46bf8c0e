"""The roce kind's plots: each group's goodput phase by phase against the baseline (the
lesson's table as a picture), and per phase DCQCN's rate per QP with its CNPs and PFC's
pause tree from the congested port upstream.

Specifications only (``lab.plotting``); ``lab.report`` draws the run's before, and each
phase's after, the plots every run gets. A phase's own numbers (the transport's rate
samples, pfcd's counters) are its ``Section.details``; the pause tree is its metrics'.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.analysis import pauses
from lab.plotting.plots import Skipped, Spec, spec_name, spec_title
from lab.plotting.sections import Section, dict_of, dicts_of, num

#: Groups take these colours in the order of their names (so incast and victim keep theirs
#: in every plot of a run that has both).
PALETTE = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
           "tab:pink", "tab:olive", "tab:cyan", "tab:gray")
#: QPs of one group are told apart by line style (identical QPs draw on top of each other).
STYLES = ("-", "--", ":", "-.")
#: Up to this many QPs the rate plot's legend names each; beyond, one entry per group.
MAX_QP_LEGEND = 8
#: The pause tree's colours by hop: the root hottest, the far ends coolest.
HOP_COLOURS = ("#b2182b", "#ef8a62", "#f4c542", "#67a9cf", "#2166ac", "#5e3c99")


def group_colours(groups: list[str]) -> dict[str, str]:
    """A colour per group, by the order of the names (stable across a run's plots)."""
    return {g: PALETTE[i % len(PALETTE)] for i, g in enumerate(sorted(set(groups)))}


@dataclass
class QpRate:
    """One QP's sending rate over the phase, and the numbers its legend entry gives."""

    qp: str
    group: str
    start_s: float            # when it started, after the phase's first QP
    t_s: list[float]          # on the phase's clock
    rc_mbps: list[float]      # DCQCN's current rate RC
    cnps: int
    cuts: int
    goodput_mbps: float
    line_mbps: float | None


def qp_rates(sec: Section) -> list[QpRate]:
    """Every QP's rate samples on the phase's clock, from the transport's output.

    The transport's samples count from its own QP's start; a QP that joins later was given
    a shorter run (``config.duration_s``: the phase's duration less its start), so its start
    is the longest QP's duration less its own.
    """
    transport = dict_of(sec.details.get("transport"))
    group_of = {qp: g for g, v in dict_of(sec.metrics.get("groups")).items()
                for qp in dict_of(dict_of(v).get("per_qp_bps"))}
    group_of |= {str(f.get("id")): str(f.get("kind")) for f in sec.flows
                 if f.get("id") not in group_of and f.get("kind")}
    runs = {k: num(dict_of(dict_of(o).get("config")).get("duration_s"))
            for k, o in transport.items()}
    longest = max((d for d in runs.values() if d is not None), default=0.0)
    out = []
    for flow_id, o in transport.items():
        o, cfg = dict_of(o), dict_of(dict_of(o).get("config"))
        qps = dicts_of(o.get("qps"))
        start = longest - runs[flow_id] if runs[flow_id] is not None else 0.0
        for i, q in enumerate(qps):
            samples = [(t, rc) for s in q.get("rate_samples") or [] if isinstance(s, list)
                       and len(s) >= 2 and (t := num(s[0])) is not None
                       and (rc := num(s[1])) is not None]
            if not samples:
                continue
            out.append(QpRate(
                qp=flow_id + (f"#{i}" if len(qps) > 1 else ""),
                group=group_of.get(flow_id, flow_id), start_s=start,
                t_s=[start + t for t, _ in samples], rc_mbps=[rc / 1e6 for _, rc in samples],
                cnps=int(num(q.get("cnps_received")) or 0),
                cuts=int(num(dict_of(q.get("dcqcn")).get("cuts")) or 0),
                goodput_mbps=(num(o.get("goodput_mbps")) or 0.0) / len(qps),
                line_mbps=num(cfg.get("rate_mbps"))))
    return out


def _cc_of(sec: Section) -> str | None:
    cc = sec.metrics.get("cc")
    if isinstance(cc, str):
        return cc
    ccs = {dict_of(dict_of(o).get("config")).get("cc")
           for o in dict_of(sec.details.get("transport")).values()}
    return next((c for c in ccs if isinstance(c, str)), None)


def _rate_caption(rows: list[QpRate]) -> str:
    """Per group: its QPs, CNPs, lowest and last rate, goodput."""
    parts = []
    for g in sorted({r.group for r in rows}):
        mine = [r for r in rows if r.group == g]
        low = min(min(r.rc_mbps) for r in mine)
        end = statistics.fmean(r.rc_mbps[-1] for r in mine)
        parts.append(f"{g}: {len(mine)} QP{'s' if len(mine) > 1 else ''}, "
                     f"{sum(r.cnps for r in mine)} CNPs, lowest {low:.1f} Mbit/s, "
                     f"last {end:.1f} Mbit/s, goodput {sum(r.goodput_mbps for r in mine):.1f}"
                     " Mbit/s")
    return "; ".join(parts) + "."


def rate_spec(sec: Section) -> Spec | Skipped:
    """DCQCN's current rate of each QP over the phase, coloured by group, its CNPs in the
    legend. A phase without congestion control has no rate to draw: every QP is paced at
    its line rate throughout, and a flat line there would read as what the QP got, which
    PFC's pauses or drops made much less (the goodput plot shows that)."""
    name = spec_name("dcqcn-rate", sec)
    cc = _cc_of(sec)
    rows = qp_rates(sec)
    if cc == "none":
        line = {r.line_mbps for r in rows if r.line_mbps}
        cnps = sum(r.cnps for r in rows)
        return Skipped(name, f"{sec.label}: no congestion control: every QP is paced at its "
                       "line rate" + (f" ({', '.join(f'{x:g}' for x in sorted(line))} Mbit/s)"
                                      if line else "")
                       + " throughout; what each got is in the goodput plot"
                       + (f" ({cnps} CNPs received and ignored)" if cnps else ""))
    if not rows:
        return Skipped(name, f"{sec.label}: no QP has rate samples")
    colours = group_colours([r.group for r in rows])
    lines = sorted({r.line_mbps for r in rows if r.line_mbps})
    vmax = max([*(max(r.rc_mbps) for r in rows), *lines])
    what = "DCQCN's sending rate" if cc == "dcqcn" else f"Sending rate ({cc})"
    title = spec_title(f"{what} per QP (RC), CNPs in the legend", sec)
    step = statistics.median(b - a for r in rows for a, b in zip(r.t_s, r.t_s[1:],
                                                                   strict=False)) \
        if any(len(r.t_s) > 1 for r in rows) else 0.0
    per_qp = len(rows) <= MAX_QP_LEGEND

    def draw(fig: Any, limit: float) -> str:
        ax = fig.add_subplot()
        nth: dict[str, int] = {}
        for r in rows:
            i = nth[r.group] = nth.get(r.group, -1) + 1
            label = (f"{r.qp} ({r.group}): {r.cnps} CNPs, goodput {r.goodput_mbps:.1f} Mbit/s"
                     if per_qp else None if i else
                     f"{r.group}: {sum(q.group == r.group for q in rows)} QPs, "
                     f"{sum(q.cnps for q in rows if q.group == r.group)} CNPs")
            ax.plot(r.t_s, r.rc_mbps, drawstyle="steps-post", lw=1.4, label=label,
                    color=colours[r.group], ls=STYLES[i % len(STYLES)])
        for x in lines:
            ax.axhline(x, color="grey", ls="--", lw=0.8, label=f"line rate {x:g} Mbit/s")
        ax.set_ylim(0, limit * 1.1 if limit > 0 else 1)
        ax.set_title(title)
        ax.set_xlabel("time since the phase's first QP started (s)")
        ax.set_ylabel("sending rate RC (Mbit/s)")
        ax.legend(fontsize=7, loc="best")
        ax.grid(alpha=0.3)
        every = f" every {1000 * step:.0f} ms" if step else ""
        return (f"Each QP's current rate as its sender's DCQCN set it, sampled{every} on the "
                "phase's clock (a QP that joined later starts later). Each step down is a "
                "CNP's cut (the receiver saw ECN's CE mark on the QP's packets); between "
                "cuts the rate climbs back towards its target. A QP that got no CNP stays at "
                "its line rate. " + _rate_caption(rows))

    return Spec(name, "dcqcn-rate", sec.name, 4.5, vmax, draw)


@dataclass
class PausedPort:
    """A port of the pause tree: its hops from the root (None: reached from no root) and
    how long its lossless priority was held."""

    dev: str
    hop: int | None
    paused_s: float
    root: bool


def ports_by_hops(tree: dict[str, Any]) -> list[PausedPort]:
    """The pause tree's ports, roots first, then by hops from the root, the longest paused
    first within a hop; ports paused but reached from no root last.

    Why this order: it reads as the pauses spread, from the congested port upstream, so a
    long bar far down is congestion that spread far.
    """
    hops = dict_of(tree.get("hops"))
    paused = dict_of(tree.get("paused_ns"))
    roots = {r for r in tree.get("roots") or [] if isinstance(r, str)}
    out = []
    for dev in sorted(set(hops) | set(paused) | roots):
        hop = num(hops.get(dev))
        out.append(PausedPort(dev, 0 if hop is None and dev in roots else
                              None if hop is None else int(hop),
                              (num(paused.get(dev)) or 0.0) / 1e9, dev in roots))
    out.sort(key=lambda p: (p.hop is None, p.hop or 0, not p.root, -p.paused_s, p.dev))
    return out


def port_label(dev: str, links: list[dict[str, Any]]) -> str:
    """``dev (node→peer)``: a switch port from the phase's links, a host's NIC from the
    switch port that faces it (hosts have one link), else the device name alone."""
    for ln in links:
        if ln.get("intf") == dev:
            return f"{dev} ({ln.get('node')}→{ln.get('peer')})"
    host = dev.rsplit("-eth", 1)[0]
    facing = [ln.get("node") for ln in links if ln.get("peer") == host]
    return f"{dev} ({host}→{facing[0]})" if len(facing) == 1 else dev


def pause_frames_sent(sec: Section) -> dict[str, int]:
    """PAUSE frames each port sent for the lossless priority, from pfcd's counters."""
    return {dev: int(num(c.get("pause_frames_tx")) or 0)
            for dev, c in pauses.lossless_counters(sec.details.get("pfc")).items()}


def pause_tree_spec(sec: Section) -> Spec | Skipped:
    """Time each port's lossless priority was paused, ports in the tree's order from the
    congested root upstream, coloured and labelled by their hops."""
    name = spec_name("pause-tree", sec)
    tree = dict_of(sec.metrics.get("pause_tree"))
    ports = ports_by_hops(tree)
    if not ports:
        why = "PFC was off" if sec.metrics.get("pfc") is False else "no port sent PAUSE"
        return Skipped(name, f"{sec.label}: no pause tree ({why})")
    sent = pause_frames_sent(sec)
    labels = [f"hop {'?' if p.hop is None else p.hop} · {port_label(p.dev, sec.links)}"
              for p in ports]
    vmax = max(p.paused_s for p in ports)
    title = spec_title(f"PFC pause tree: time paused per port (priority {pauses.PRIORITY})",
                       sec)
    length = num(sec.duration_s)

    def colour(p: PausedPort) -> str:
        return "lightgrey" if p.hop is None else HOP_COLOURS[min(p.hop, len(HOP_COLOURS) - 1)]

    def draw(fig: Any, limit: float) -> str:
        ax = fig.add_subplot()
        ys = list(range(len(ports)))
        seen: set[str] = set()
        for y, p in zip(ys, ports, strict=True):
            key = "?" if p.hop is None else str(p.hop)
            label = None if key in seen else (
                "hop 0: root, the congested port" if p.root and p.hop == 0 else
                "reached from no root" if p.hop is None else f"hop {p.hop}")
            seen.add(key)
            ax.barh(y, p.paused_s, color=colour(p), height=0.7, label=label)
            if not p.paused_s:          # a root is never paused: mark it, or it is not seen
                ax.plot([0], [y], marker="s", ms=7, color=colour(p), clip_on=False)
            pct = 100 * p.paused_s / length if length else 0.0
            share = "" if not pct else f" ({pct:.0f} % of the phase)" if pct >= 1 \
                else " (<1 % of the phase)"
            text = (f"root: sent {sent.get(p.dev, 0):,} PAUSE frames" if p.root and
                    not p.paused_s else f"{p.paused_s:.2f} s{share}")
            ax.text(p.paused_s + limit * (0.01 if p.paused_s else 0.03), y, text,
                    va="center", fontsize=7)
        ax.set_yticks(ys)
        ax.set_yticklabels(labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0, (limit if limit > 0 else 1.0) * 1.35)
        ax.set_title(title)
        ax.set_xlabel("time paused during the phase (s)")
        ax.set_ylabel("port, by hops from the root")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.grid(axis="x", alpha=0.3)
        return _pause_caption(ports, sent, sec, labels)

    return Spec(name, "pause-tree", sec.name, max(3.0, 1.4 + 0.28 * len(ports)), vmax, draw)


def _pause_caption(ports: list[PausedPort], sent: dict[str, int], sec: Section,
                   labels: list[str]) -> str:
    roots = [(lab.split(" · ", 1)[1], sent.get(p.dev, 0))
             for p, lab in zip(ports, labels, strict=True) if p.root]
    longest, where = max(zip(ports, labels, strict=True), key=lambda x: x[0].paused_s)
    hops = max((p.hop for p in ports if p.hop is not None), default=0)
    return ("How PFC's pauses spread from the congested port upstream: the root sent PAUSE "
            "and was never paused itself (its queue is the one that filled); each port "
            "below it was held by the port it feeds, hop k being k links upstream. Every "
            "packet of the lossless priority waits at a paused port, also a flow's that "
            "never crosses the root. "
            f"Roots: {', '.join(f'{r} ({n:,} PAUSE frames)' for r, n in roots) or 'none'}; "
            f"{sum(p.paused_s for p in ports):.2f} s paused in all over "
            f"{sum(1 for p in ports if p.paused_s)} ports, reaching {hops} hops; longest "
            f"{where.split(' · ', 1)[1]} at {longest.paused_s:.2f} s"
            + (f", lossless drops {sec.metrics['lossless_drops']:,}"
               if isinstance(sec.metrics.get("lossless_drops"), int) else "") + ".")


def group_goodput_spec(result: dict[str, Any], secs: list[Section]) -> Spec | Skipped:
    """Each group's goodput per phase, the share of the baseline phase's above each bar and
    the baseline's own as a dashed line per group: the lesson's table as one picture."""
    phases = [(s.name, dict_of(s.metrics.get("groups"))) for s in secs if s.name]
    phases = [(n, g) for n, g in phases if g]
    if not phases:
        return Skipped("group-goodput", "no phase has groups of QPs")
    groups = sorted({g for _, gs in phases for g in gs})
    colours = group_colours(groups)
    base = dict_of(result.get("metrics")).get("baseline")
    ref = dict(phases).get(base, {}) if isinstance(base, str) else {}
    mbps = {(n, g): (num(dict_of(v).get("goodput_bps")) or 0.0) / 1e6
            for n, gs in phases for g, v in gs.items()}
    share = {(n, g): num(dict_of(v).get("vs_baseline")) for n, gs in phases
             for g, v in gs.items()}
    vmax = max(mbps.values())
    title = "Goodput per group, phase by phase" + (f" (% of phase {base})" if ref else "")

    def draw(fig: Any, limit: float) -> str:
        ax = fig.add_subplot()
        w = 0.8 / len(groups)
        for j, g in enumerate(groups):
            at = [(i - 0.4 + w * (j + 0.5), n) for i, (n, gs) in enumerate(phases) if g in gs]
            ax.bar([x for x, _ in at], [mbps[(n, g)] for _, n in at], w * 0.9,
                   color=colours[g], label=g)
            for x, n in at:
                s = share[(n, g)]
                ax.text(x, mbps[(n, g)] + limit * 0.01, f"{mbps[(n, g)]:.1f}"
                        + (f"\n{100 * s:.0f} %" if s is not None else ""),
                        ha="center", va="bottom", fontsize=7,
                        bbox={"fc": "white", "ec": "none", "pad": 0.5, "alpha": 0.8})
            if g in ref:
                ax.axhline(mbps[(base, g)], color=colours[g], ls="--", lw=0.9,
                           label=f"{g} in {base}: {mbps[(base, g)]:.1f} Mbit/s")
        ax.set_xticks(list(range(len(phases))))
        ax.set_xticklabels([n + (" (baseline)" if n == base else "") for n, _ in phases])
        ax.set_ylim(0, (limit if limit > 0 else 1.0) * 1.25)
        ax.set_title(title)
        ax.set_xlabel("phase")
        ax.set_ylabel("goodput, summed over the group's QPs (Mbit/s)")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.grid(axis="y", alpha=0.3)
        table = "; ".join(f"{n}: " + ", ".join(
            f"{g} {mbps[(n, g)]:.1f}" + (f" ({100 * s:.0f} %)" if (s := share[(n, g)])
                                          is not None else "") for g in gs)
            for n, gs in phases)
        return ("What each group of QPs delivered in each phase (the transport's completions), "
                + (f"with its share of what it delivered in phase {base}, where it ran "
                   "without the trouble (the dashed lines). " if ref else ". ")
                + f"In Mbit/s: {table}.")

    return Spec("group-goodput", "group-goodput", "", 4.5, vmax, draw)


def run_plots(result: dict[str, Any], secs: list[Section]) -> list[Spec | Skipped | None]:
    """The run's plot, before the per-phase ones: goodput per group against the baseline."""
    return [group_goodput_spec(result, secs)]


def section_plots(sec: Section, _run_dir: Path | None) -> list[Spec | Skipped | None]:
    """A phase's plots, after the ones every run gets: DCQCN's rates, the pause tree."""
    return [rate_spec(sec), pause_tree_spec(sec)]
