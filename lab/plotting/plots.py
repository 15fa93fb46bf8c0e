"""Plot specifications (data only): what every kind's run gets, per section.

A spec holds the data and a ``draw`` function that ``lab.report.draw`` calls with a
matplotlib figure; nothing is drawn here. ``vmax`` is the data's extent on the value axis,
so that a comparison can draw two runs on the same limits. A kind's own plots are specs
too, in its package (``lab/kinds/<kind>/plots.py``), built on these.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lab.plotting.sections import Section, dict_of, flow_label, link_labels, num, slug

#: Up to this many links a utilisation plot draws lines; more become a heatmap.
MAX_LINES = 8
#: A queue plot draws at most this many ports (the deepest ones).
MAX_QUEUES = 8
#: The one colour scale of utilisation (the heatmap, the weathermap) and its label.
UTIL_CMAP = "viridis"
UTIL_LABEL = "utilisation (% of link rate)"


@dataclass
class Plot:
    """A PNG that was made, with the words on it (read back from the figure) and its caption."""

    name: str                 # stable across runs of a scenario: "util-incident"
    file: str                 # file name in the plots directory
    kind: str                 # util | queue | goodput | stalls | stall-phases | step-cdf
    section: str              # the phase, or "" for the whole run
    title: str
    xlabel: str
    ylabel: str
    legend: list[str]
    colorbar: str
    caption: str
    width_px: int
    height_px: int


@dataclass
class Skipped:
    """A plot that was not made, and why (the report lists these too)."""

    name: str
    reason: str


@dataclass
class Spec:
    """What to draw: ``vmax`` is the data's extent on the value axis, shared in a compare."""

    name: str
    kind: str
    section: str
    height_in: float
    vmax: float
    draw: Callable[[Any, float], str]     # (figure, axis limit) -> caption


def spec_name(kind: str, sec: Section) -> str:
    return f"{kind}-{slug(sec.name)}" if sec.name else kind


def spec_title(what: str, sec: Section) -> str:
    return f"{what} — phase {sec.name}" if sec.name else what


def util_spec(sec: Section) -> Spec | Skipped:
    """Utilisation of every switch/router egress port over time, in % of its rate."""
    name = spec_name("util", sec)
    rows = []
    for ln, label in zip(sec.links, link_labels(sec.links), strict=True):
        s = dict_of(ln.get("series"))
        t, bps, bw = s.get("t") or [], s.get("tx_bps") or [], num(ln.get("bw_mbps"))
        if not t or len(t) != len(bps) or not bw:
            continue
        rows.append((label, ln, [float(x) for x in t], [100 * b / (bw * 1e6) for b in bps]))
    if not rows:
        return Skipped(name, f"{sec.label}: no link has a tx_bps series")
    if len(rows) > MAX_LINES:
        # A heatmap row of an idle port is one dark stripe that says nothing: leave them out.
        busy = [r for r in rows if (r[1].get("tx_bytes") or 0) > 0 or max(r[3]) > 0]
        idle = len(rows) - len(busy)
        rows = busy or rows
    else:
        idle = 0
    top = sorted(rows, key=lambda r: -(num(r[1].get("util_mean")) or 0))[:3]
    finding = "Busiest: " + ", ".join(
        f"{lab} {100 * (num(ln.get('util_mean')) or 0):.0f} % mean "
        f"(max {100 * (num(ln.get('util_max')) or 0):.0f} %)" for lab, ln, _, _ in top) + "."
    vmax = max(max(r[3]) for r in rows)
    heat = len(rows) > MAX_LINES
    title = spec_title("Link utilisation over time", sec)

    def draw(fig: Any, limit: float) -> str:
        ax = fig.add_subplot()
        ax.set_title(title)
        ax.set_xlabel("time since the traffic started (s)")
        if heat:
            import numpy as np
            step = statistics.median(
                b - a for r in rows for a, b in zip(r[2], r[2][1:], strict=False)
                if b > a) if any(len(r[2]) > 1 for r in rows) else 0.1
            t_end = max(r[2][-1] for r in rows)
            grid = np.arange(0.0, t_end + step / 2, step)
            img = np.array([np.interp(grid, r[2], r[3], left=np.nan, right=np.nan)
                            for r in rows])
            mesh = ax.imshow(img, aspect="auto", interpolation="nearest", cmap=UTIL_CMAP,
                             vmin=0, vmax=100, extent=(0, float(grid[-1]) + step, len(rows), 0))
            ax.set_yticks([i + 0.5 for i in range(len(rows))])
            ax.set_yticklabels([r[0] for r in rows], fontsize=7 if len(rows) <= 30 else 5.5)
            ax.set_ylabel("link (egress port)")
            cb = fig.colorbar(mesh, ax=ax, extend="max" if vmax > 100 else "neither")
            cb.set_label(UTIL_LABEL)
            what = (f"Each row is one egress port, colour its utilisation per sample "
                    f"(yellow = full{', beyond 100 % = sampling jitter' if vmax > 100 else ''}). "
                    "Look for rows that stay yellow (a bottleneck) while their siblings "
                    "(other uplinks of the same switch) stay dark: unequal hashing.")
            if idle:
                what += f" {idle} ports that sent nothing are left out."
        else:
            for label, ln, t, u in rows:
                ax.plot(t, u, lw=1.2,
                        label=f"{label} (mean {100 * (num(ln.get('util_mean')) or 0):.0f} %)")
            ax.set_ylabel("utilisation (% of link rate)")
            ax.set_ylim(0, max(105.0, limit * 1.05))
            ax.axhline(100, color="grey", lw=0.8, ls="--")
            ax.legend(fontsize=7, loc="best")
            ax.grid(alpha=0.3)
            what = ("One line per egress port. Look for lines pinned at the dashed 100 % "
                    "line (the bottleneck) and for ports that should share load but do not.")
        return f"{what} {finding}"

    height = min(12.0, max(3.5, 0.16 * len(rows) + 1.6)) if heat else 4.5
    return Spec(name, "util", sec.name, height, vmax, draw)


def queue_spec(sec: Section, limit_bytes: float | None) -> Spec | Skipped:
    """Queue occupancy of the deepest ports over time (the qdisc backlog in kB)."""
    name = spec_name("queue", sec)
    rows = []
    for ln, label in zip(sec.links, link_labels(sec.links), strict=True):
        s = dict_of(ln.get("series"))
        q, t = s.get("queue_bytes"), s.get("t") or []
        if isinstance(q, list) and q and len(q) == len(t):
            rows.append((label, ln, t, [x / 1000 for x in q]))
    if not rows:
        return Skipped(name, f"{sec.label}: no queue_bytes series")
    deep = sorted((r for r in rows if max(r[3]) > 0), key=lambda r: -max(r[3]))
    if not deep:
        unsampled = len(sec.links) - len(rows)
        return Skipped(name, f"{sec.label}: none of the {len(rows)} sampled queues held a "
                             "byte" + (f" ({unsampled} ports, e.g. routers', have no queue "
                                       "series)" if unsampled else ""))
    shown = deep[:MAX_QUEUES]
    marking = dict_of(dict_of(sec.metrics.get("marking")).get("config"))
    k_bytes = num(marking.get("k_bytes")) or num(marking.get("kmin_bytes"))
    vmax = max(max(r[3]) for r in shown)
    title = spec_title("Queue occupancy over time", sec)
    worst_label, worst, _, worst_q = shown[0]

    def draw(fig: Any, limit: float) -> str:
        ax = fig.add_subplot()
        for label, ln, t, q in shown:
            ax.plot(t, q, lw=1.1, label=f"{label} (max {max(q):.0f} kB, drops "
                                        f"{ln.get('drops', 0)})")
        top = limit
        if limit_bytes:
            ax.axhline(limit_bytes / 1000, color="red", ls="--", lw=0.9,
                       label=f"queue limit {limit_bytes / 1000:.0f} kB")
            top = max(top, limit_bytes / 1000)
        if k_bytes:
            ax.axhline(k_bytes / 1000, color="orange", ls=":", lw=1.2,
                       label=f"ECN marking threshold K {k_bytes / 1000:.0f} kB")
        ax.set_ylim(0, top * 1.08)
        ax.set_title(title)
        ax.set_xlabel("time since the traffic started (s)")
        ax.set_ylabel("queue occupancy (kB)")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.grid(alpha=0.3)
        more = f" (the {len(shown)} deepest of {len(deep)} ports that queued)" \
            if len(deep) > len(shown) else ""
        full = (f", {100 * max(worst_q) * 1000 / limit_bytes:.0f} % of the limit"
                if limit_bytes else "")
        return (f"Bytes waiting in each egress port's queue{more}. A queue that reaches the "
                "red limit drops packets; one that sits high adds delay to every packet "
                f"through it. Deepest: {worst_label} at {max(worst_q):.0f} kB{full}, "
                f"{worst.get('drops', 0)} drops.")

    return Spec(name, "queue", sec.name, 4.5, vmax, draw)


def goodput_spec(sec: Section) -> Spec | Skipped:
    """Per-flow goodput, beside the offered rate where the flow had one."""
    name = spec_name("goodput", sec)
    flows = [f for f in sec.flows if num(f.get("goodput_bps")) is not None]
    if not flows:
        return Skipped(name, f"{sec.label}: no flow has a goodput")
    good = [(num(f.get("goodput_bps")) or 0.0) / 1e6 for f in flows]
    offered = [(num(f.get("offered_bps")) or 0) / 1e6 for f in flows]
    has_offered = any(o > 0 for o in offered)
    vmax = max(good + offered)
    title = spec_title("Goodput per flow", sec)
    labels = [flow_label(f, via=True) for f in flows]

    def draw(fig: Any, limit: float) -> str:
        ax = fig.add_subplot()
        xs = range(len(flows))
        w = 0.4 if has_offered else 0.7
        if has_offered:
            ax.bar([x - w / 2 for x in xs], offered, w, color="#bbbbbb", label="offered")
            ax.bar([x + w / 2 for x in xs], good, w, color="#1f77b4", label="goodput")
        else:
            ax.bar(list(xs), good, w, color="#1f77b4", label="goodput (closed loop: "
                                                             "no offered rate)")
        ax.set_xticks(list(xs))
        small = len(flows) > 16
        ax.set_xticklabels(labels, rotation=90 if small else 30, ha="center" if small
                           else "right", fontsize=6 if len(flows) > 32 else 8)
        ax.set_ylim(0, limit * 1.1 if limit > 0 else 1)
        ax.set_title(title)
        ax.set_xlabel("flow")
        ax.set_ylabel("rate (Mbit/s)")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        total = sum(good)
        if has_offered:
            ratios = [(g / o, lab) for g, o, lab in zip(good, offered, labels, strict=True)
                      if o > 0]
            worst = min(ratios)
            return (f"Each flow's goodput (blue) beside what it offered (grey). Flows far "
                    "below their offer shared a congested link; compare them with their "
                    f"paths in the flows table. Total {total:.1f} of "
                    f"{sum(offered):.1f} Mbit/s offered; worst {worst[1]} at "
                    f"{100 * worst[0]:.0f} % of its offer.")
        lo, hi = min(good), max(good)
        return ("Each connection's goodput over its life. These flows are closed-loop (they "
                "send a fixed amount as fast as they can), so a flow well below the others "
                f"crossed a shared or congested link. Total {total:.1f} Mbit/s; "
                f"slowest {lo:.1f}, fastest {hi:.1f} Mbit/s.")

    return Spec(name, "goodput", sec.name, 4.5, vmax, draw)
