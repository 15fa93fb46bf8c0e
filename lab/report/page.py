"""Reports: a run's result.json as plots and one report.html, and two runs side by side.

Why a report and not just result.json: the numbers that decide a question (which uplink
was hot, when a stream stalled, how long the slow steps were) are time series and
distributions, and a table of means hides exactly the part that matters. So every plot
here is one question, captioned with what to look at and what this run shows.

Why the HTML is self-contained (PNGs as base64 ``data:`` URIs, inline CSS, no fonts,
scripts or stylesheets from anywhere): a report is mailed, attached to an issue or opened
from a CI artefact on a machine with no network, and it must look the same there as it did
when it was written. The only script sets ``data-plots`` on the body (the number of images
that decoded), so a headless browser can tell that every plot rendered.

What is plotted depends on what the result holds (``kind``: ecmp, collective, streaming;
phased kinds have ``phase_details``): nothing is drawn from data that is not there, and
every plot not made is listed with the reason. Plots are specified first (data only, no
matplotlib) and drawn second, so a comparison can draw both runs on the same axis limits.

matplotlib (Agg) is imported by the functions that draw: importing it costs about a
second, which ``fabriclab`` should not pay for commands that draw nothing.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
import math
import re
import statistics
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lab.model.result import ResultError, load_result
from lab.model.stats import percentile

#: Plot size: 8 in at 100 dpi is 800 px, readable in a report and on a laptop screen.
WIDTH_IN, DPI = 8.0, 100
#: Up to this many links a utilisation plot draws lines; more become a heatmap.
MAX_LINES = 8
#: A queue plot draws at most this many ports (the deepest ones).
MAX_QUEUES = 8
PLOTS_DIR = "plots"
REPORT_NAME = "report.html"
COMPARE_NAME = "compare.html"


ReportError = ResultError


# --------------------------------------------------------------------------------------------
# Reading a run
# --------------------------------------------------------------------------------------------


def kind_of(result: dict[str, Any]) -> str:
    """The result's kind; results from before kinds existed are ``ecmp``."""
    return str(result.get("kind") or "ecmp")


@dataclass
class Section:
    """One phase of a run (or the whole run, ``name`` empty): its links, flows and metrics."""

    name: str
    duration_s: float | None
    links: list[dict[str, Any]]
    flows: list[dict[str, Any]]
    metrics: dict[str, Any]
    events: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"phase {self.name}" if self.name else "run"


def sections(result: dict[str, Any]) -> list[Section]:
    """Phases in run order, from ``phase_details``; an unphased run is one nameless section.

    The top-level links and flows of a phased result repeat one phase's, so they are not a
    section of their own.
    """
    details = result.get("phase_details")
    metrics = result.get("metrics") if isinstance(result.get("metrics"), dict) else {}
    if isinstance(details, dict) and details:
        per_phase = metrics.get("phases") if isinstance(metrics.get("phases"), dict) else {}
        return [Section(str(name), d.get("duration_s"), _dicts(d.get("links")),
                        _dicts(d.get("flows")), _dict(per_phase.get(name)),
                        _dict(d.get("events")))
                for name, d in details.items() if isinstance(d, dict)]
    return [Section("", result.get("duration_s"), _dicts(result.get("links")),
                    _dicts(result.get("flows")), metrics)]


def _dict(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _dicts(x: Any) -> list[dict[str, Any]]:
    return [e for e in x if isinstance(e, dict)] if isinstance(x, list) else []


def _num(x: Any) -> float | None:
    """A finite number, or None (bools, strings, NaN and missing values are not numbers)."""
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return float(x)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()


def _link_labels(links: list[dict[str, Any]]) -> list[str]:
    """``node→peer``, with the interface when two links join the same pair of nodes."""
    base = [f"{ln.get('node', '?')}→{ln.get('peer', '?')}" for ln in links]
    labels = []
    for ln, b in zip(links, base, strict=True):
        if base.count(b) > 1:
            b += f" ({ln.get('intf') or 'port ' + str(ln.get('port', '?'))})"
        labels.append(b)
    return labels


def _flow_label(flow: dict[str, Any], via: bool = False) -> str:
    """A flow's id without its phase prefix (``incident/big5`` → ``big5``).

    With ``via``, the path choice the plot is about: a stream's edge uplink, or the switch
    in the middle of a leaf-spine path (``f3 via spine2``), the ECMP choice.
    """
    label = str(flow.get("id", "?")).rsplit("/", 1)[-1]
    path, uplinks = flow.get("path"), flow.get("uplinks")
    if via and isinstance(uplinks, list) and uplinks:
        # A stream's story is the edge uplink it left (or entered) by, not the spine.
        label += " via " + ", ".join(str(u).split("->", 1)[0] for u in uplinks)
    elif via and isinstance(path, list) and len(path) == 3:
        label += f" via {path[1]}"
    return label


# --------------------------------------------------------------------------------------------
# Plot specifications (data only) and drawing
# --------------------------------------------------------------------------------------------


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
class _Spec:
    """What to draw: ``vmax`` is the data's extent on the value axis, shared in a compare."""

    name: str
    kind: str
    section: str
    height_in: float
    vmax: float
    draw: Callable[[Any, float], str]     # (figure, axis limit) -> caption


def _specs(result: dict[str, Any], run_dir: Path | None) -> tuple[list[_Spec], list[Skipped]]:
    """Every plot the result has data for, in report order, and the ones it has not."""
    specs: list[_Spec] = []
    skipped: list[Skipped] = []
    kind = kind_of(result)
    secs = sections(result)
    queue_limit = _num(_dict(_dict(result.get("params")).get("topology")).get("queue_bytes"))

    def add(made: _Spec | Skipped | None) -> None:
        if isinstance(made, _Spec):
            specs.append(made)
        elif isinstance(made, Skipped):
            skipped.append(made)

    if kind == "collective":
        add(_step_cdf_spec(result, secs))
    if kind == "streaming":
        add(_stall_phases_spec(secs))
    for sec in secs:
        add(_util_spec(sec))
        add(_queue_spec(sec, queue_limit))
        add(_goodput_spec(sec))
        if kind == "streaming":
            add(_stall_spec(sec, run_dir))
    return specs, skipped


def _name(kind: str, sec: Section) -> str:
    return f"{kind}-{_slug(sec.name)}" if sec.name else kind


def _title(what: str, sec: Section) -> str:
    return f"{what} — phase {sec.name}" if sec.name else what


def _util_spec(sec: Section) -> _Spec | Skipped:
    """Utilisation of every switch/router egress port over time, in % of its rate."""
    name = _name("util", sec)
    rows = []
    for ln, label in zip(sec.links, _link_labels(sec.links), strict=True):
        s = _dict(ln.get("series"))
        t, bps, bw = s.get("t") or [], s.get("tx_bps") or [], _num(ln.get("bw_mbps"))
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
    top = sorted(rows, key=lambda r: -(_num(r[1].get("util_mean")) or 0))[:3]
    finding = "Busiest: " + ", ".join(
        f"{lab} {100 * (_num(ln.get('util_mean')) or 0):.0f} % mean "
        f"(max {100 * (_num(ln.get('util_max')) or 0):.0f} %)" for lab, ln, _, _ in top) + "."
    vmax = max(max(r[3]) for r in rows)
    heat = len(rows) > MAX_LINES
    title = _title("Link utilisation over time", sec)

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
            mesh = ax.imshow(img, aspect="auto", interpolation="nearest", cmap="viridis",
                             vmin=0, vmax=100, extent=(0, float(grid[-1]) + step, len(rows), 0))
            ax.set_yticks([i + 0.5 for i in range(len(rows))])
            ax.set_yticklabels([r[0] for r in rows], fontsize=7 if len(rows) <= 30 else 5.5)
            ax.set_ylabel("link (egress port)")
            cb = fig.colorbar(mesh, ax=ax, extend="max" if vmax > 100 else "neither")
            cb.set_label("utilisation (% of link rate)")
            what = (f"Each row is one egress port, colour its utilisation per sample "
                    f"(yellow = full{', beyond 100 % = sampling jitter' if vmax > 100 else ''}). "
                    "Look for rows that stay yellow (a bottleneck) while their siblings "
                    "(other uplinks of the same switch) stay dark: unequal hashing.")
            if idle:
                what += f" {idle} ports that sent nothing are left out."
        else:
            for label, ln, t, u in rows:
                ax.plot(t, u, lw=1.2,
                        label=f"{label} (mean {100 * (_num(ln.get('util_mean')) or 0):.0f} %)")
            ax.set_ylabel("utilisation (% of link rate)")
            ax.set_ylim(0, max(105.0, limit * 1.05))
            ax.axhline(100, color="grey", lw=0.8, ls="--")
            ax.legend(fontsize=7, loc="best")
            ax.grid(alpha=0.3)
            what = ("One line per egress port. Look for lines pinned at the dashed 100 % "
                    "line (the bottleneck) and for ports that should share load but do not.")
        return f"{what} {finding}"

    height = min(12.0, max(3.5, 0.16 * len(rows) + 1.6)) if heat else 4.5
    return _Spec(name, "util", sec.name, height, vmax, draw)


def _queue_spec(sec: Section, limit_bytes: float | None) -> _Spec | Skipped:
    """Queue occupancy of the deepest ports over time (the qdisc backlog in kB)."""
    name = _name("queue", sec)
    rows = []
    for ln, label in zip(sec.links, _link_labels(sec.links), strict=True):
        s = _dict(ln.get("series"))
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
    marking = _dict(_dict(sec.metrics.get("marking")).get("config"))
    k_bytes = _num(marking.get("k_bytes")) or _num(marking.get("kmin_bytes"))
    vmax = max(max(r[3]) for r in shown)
    title = _title("Queue occupancy over time", sec)
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

    return _Spec(name, "queue", sec.name, 4.5, vmax, draw)


def _goodput_spec(sec: Section) -> _Spec | Skipped:
    """Per-flow goodput, beside the offered rate where the flow had one."""
    name = _name("goodput", sec)
    flows = [f for f in sec.flows if _num(f.get("goodput_bps")) is not None]
    if not flows:
        return Skipped(name, f"{sec.label}: no flow has a goodput")
    good = [(_num(f.get("goodput_bps")) or 0.0) / 1e6 for f in flows]
    offered = [(_num(f.get("offered_bps")) or 0) / 1e6 for f in flows]
    has_offered = any(o > 0 for o in offered)
    vmax = max(good + offered)
    title = _title("Goodput per flow", sec)
    labels = [_flow_label(f, via=True) for f in flows]

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

    return _Spec(name, "goodput", sec.name, 4.5, vmax, draw)


def _player_streams(run_dir: Path | None, phase: str) -> dict[tuple[str, int], dict[str, Any]]:
    """The players' own records of a phase, by (viewer host, stream id).

    result.json keeps each stream's stall count and total only; the stall intervals are in
    the players' output (``streams/<phase>/<host>.play.json``) that the run copies beside it.
    """
    out: dict[tuple[str, int], dict[str, Any]] = {}
    if run_dir is None:
        return out
    for path in sorted((run_dir / "streams" / phase).glob("*.play.json")):
        try:
            play = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for s in _dicts(_dict(play).get("streams")):
            if isinstance(s.get("stream_id"), int):
                out[(path.name.removesuffix(".play.json"), s["stream_id"])] = s
    return out


def _stall_spec(sec: Section, run_dir: Path | None) -> _Spec | Skipped:
    """Per stream, when it played and when it stalled, on the phase's clock."""
    name = _name("stalls", sec)
    streams = [f for f in sec.flows if f.get("kind") == "stream"]
    if not streams:
        return Skipped(name, f"{sec.label}: no streams")
    players = _player_streams(run_dir, sec.name)
    rows = []
    for f in streams:
        # The result's own copy of the player's timeline; older results only have it in
        # the players' files, matched by the stream number at the end of the flow id.
        p = _dict(f.get("playout")) or None
        if p is None or _num(p.get("first_arrival_unix")) is None:
            m = re.search(r"(\d+)$", str(f.get("id", "")))
            p = players.get((str(f.get("dst")), int(m.group(1)))) if m else None
        if p is not None and _num(p.get("first_arrival_unix")) is not None:
            rows.append((f, p))
    title = _title("Stream stalls", sec)
    total = sum(int(_num(f.get("stalls")) or 0) for f in streams)
    total_s = sum(_num(f.get("stall_s")) or 0 for f in streams)
    stalled = [_flow_label(f) for f in streams if (_num(f.get("stalls")) or 0) > 0]
    summary = (f"{total} stalls, {total_s:.1f} s in all"
               + (f", on {', '.join(stalled)}." if stalled else ": no viewer saw a stall."))
    if not rows:
        # Without the players' files only the totals are known: show those, per stream.
        stall_s = [_num(f.get("stall_s")) or 0 for f in streams]

        def draw_totals(fig: Any, limit: float) -> str:
            ax = fig.add_subplot()
            ax.barh(range(len(streams)), stall_s, color="#d62728", label="stall time")
            ax.set_yticks(list(range(len(streams))))
            ax.set_yticklabels([_flow_label(f) for f in streams], fontsize=8)
            ax.invert_yaxis()
            ax.set_xlim(0, max(limit, 1.0) * 1.1)
            ax.set_title(title + " (totals; the players' timelines are not in this run)")
            ax.set_xlabel("time stalled (s)")
            ax.set_ylabel("stream")
            ax.legend(fontsize=8)
            return ("Seconds each viewer's playback was frozen waiting for media (the "
                    "players' per-stall timelines were not found, so only totals). " + summary)

        return _Spec(name, "stalls", sec.name, max(3.0, 0.3 * len(streams) + 1.5),
                     max(stall_s), draw_totals)

    t0 = _num(sec.events.get("phase_start_unix"))
    clock = "time since the phase started (s)"
    if t0 is None:
        t0 = min(float(p["first_arrival_unix"]) for _, p in rows)
        clock = "time since the phase's first frame arrived (s)"
    bars = []
    for f, p in rows:
        join = float(p["first_arrival_unix"]) - t0
        startup = _num(p.get("startup_delay_s"))
        end = _num(p.get("play_end_s"))
        stalls = [(join + float(e["start_s"]), float(e["duration_s"]))
                  for e in _dicts(p.get("stall_events"))
                  if _num(e.get("start_s")) is not None and _num(e.get("duration_s"))]
        bars.append((_flow_label(f), join, startup, end, stalls))
    cut = _num(sec.events.get("cut_unix"))
    restore = _num(sec.events.get("restore_unix"))
    marks = [(x - t0, lab) for x, lab in ((cut, f"cut {sec.events.get('cut', '')}"),
                                          (restore, "restored")) if x is not None]
    vmax = max([j + (e or s or 0) for _, j, s, e, _ in bars] + [m[0] for m in marks] + [0.0])

    def draw(fig: Any, limit: float) -> str:
        from matplotlib.patches import Patch
        ax = fig.add_subplot()
        for i, (_, join, startup, end, stalls) in enumerate(bars):
            if end is not None:
                ax.broken_barh([(join, end)], (i - 0.35, 0.7), color="#9ecae1")
            if startup:
                ax.broken_barh([(join, startup)], (i - 0.35, 0.7), color="#fdd49e")
            if stalls:
                ax.broken_barh(stalls, (i - 0.35, 0.7), color="#d62728")
        handles = [Patch(color="#fdd49e", label="start-up (buffering)"),
                   Patch(color="#9ecae1", label="playing"),
                   Patch(color="#d62728", label="stalled")]
        for (x, lab), style in zip(marks, ("--", ":"), strict=False):
            handles.append(ax.axvline(x, color="black", ls=style, lw=1.0, label=lab))
        ax.set_yticks(list(range(len(bars))))
        ax.set_yticklabels([b[0] for b in bars], fontsize=8)
        ax.set_ylim(len(bars) - 0.5, -0.5)
        ax.set_xlim(0, max(limit, 1.0) * 1.03)
        ax.set_title(title)
        ax.set_xlabel(clock)
        ax.set_ylabel("stream")
        ax.legend(handles=handles, fontsize=7, loc="upper center", ncols=len(handles),
                  bbox_to_anchor=(0.5, -0.13 if len(bars) > 6 else -0.2))
        ax.grid(axis="x", alpha=0.3)
        extra = " The dashed lines are the failover's cut and restore." if marks else ""
        return ("One row per stream, from its first frame to the end of playback: red is "
                "time the viewer's picture was frozen while the player rebuffered. Stalls "
                "that line up across streams point at one shared link or event." + extra
                + " " + summary)

    return _Spec(name, "stalls", sec.name, max(3.0, 0.3 * len(bars) + 1.6), vmax, draw)


def _stall_phases_spec(secs: list[Section]) -> _Spec | Skipped:
    """Stall seconds (and stall count) per phase: the streaming scenario's story in one plot."""
    rows = [(s.name, _num(s.metrics.get("stall_s")), int(_num(s.metrics.get("stalls")) or 0))
            for s in secs if s.name]
    rows = [(n, v, c) for n, v, c in rows if v is not None]
    if not rows:
        return Skipped("stall-phases", "no phase has stall totals")
    vmax = max(v for _, v, _ in rows)

    def draw(fig: Any, limit: float) -> str:
        ax = fig.add_subplot()
        bars = ax.bar([n for n, _, _ in rows], [v for _, v, _ in rows], color="#d62728",
                      label="stall time (all streams)")
        for b, (_, v, c) in zip(bars, rows, strict=True):
            ax.annotate(f"{c} stall{'' if c == 1 else 's'}", (b.get_x() + b.get_width() / 2, v),
                        ha="center", va="bottom", fontsize=8, xytext=(0, 2),
                        textcoords="offset points")
        ax.set_ylim(0, max(limit, 1.0) * 1.15)
        ax.set_title("Stall time per phase")
        ax.set_xlabel("phase")
        ax.set_ylabel("time stalled, summed over streams (s)")
        ax.tick_params(axis="x", labelsize=8)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        worst = max(rows, key=lambda r: r[1])
        return ("Total seconds of frozen playback per phase (stall count on each bar): the "
                "incident should stand out and each fix should bring it down. Worst: "
                f"{worst[0]} with {worst[1]:.1f} s in {worst[2]} stalls.")

    return _Spec("stall-phases", "stall-phases", "", 4.0, vmax, draw)


def _step_times(result: dict[str, Any], secs: list[Section]) -> list[tuple[str, list[float]]]:
    """Measured (non-warm-up) step times per phase, in ms."""
    series = [(s.name, s.metrics.get("step_series")) for s in secs if s.name]
    if not any(isinstance(x, list) for _, x in series):
        series = [("job", _dict(result.get("metrics")).get("step_series"))]
    out = []
    for name, steps in series:
        ms = [1000 * v for st in _dicts(steps)
              if not st.get("warmup") and (v := _num(st.get("step_s"))) is not None]
        if ms:
            out.append((name, ms))
    return out


def _step_cdf_spec(result: dict[str, Any], secs: list[Section]) -> _Spec | Skipped:
    """CDF of the job's step times, one line per phase."""
    phases = _step_times(result, secs)
    if not phases:
        return Skipped("step-cdf", "no measured steps in metrics.step_series")
    vmax = max(max(ms) for _, ms in phases)
    stats = [(n, percentile(ms, 50), percentile(ms, 99), len(ms)) for n, ms in phases]

    def draw(fig: Any, limit: float) -> str:
        ax = fig.add_subplot()
        for (name, ms), (_, p50, p99, n) in zip(phases, stats, strict=True):
            xs = sorted(ms)
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step([xs[0], *xs], [0.0, *ys], where="post", lw=1.5,
                    label=f"{name}: n={n}, p50 {p50:.0f} ms, p99 {p99:.0f} ms")
        ax.set_xlim(0, limit * 1.05)
        ax.set_ylim(0, 1.02)
        ax.set_title("Step time CDF" + (" per phase" if len(phases) > 1 else ""))
        ax.set_xlabel("step time (ms)")
        ax.set_ylabel("fraction of steps ≤ x")
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3)
        best = min(stats, key=lambda s: s[1])
        worst = max(stats, key=lambda s: s[2])
        return ("The share of training steps that finished within a given time (warm-up "
                "steps left out). A steep line is a steady job; a line that bends right "
                "late is a tail of slow steps that waited on a congested link (a hash "
                "collision, a checkpoint, an incast). Every GPU waits for the slowest "
                f"rank, so the tail is what the job pays. Fastest median: {best[0]} "
                f"{best[1]:.0f} ms; longest tail: {worst[0]} p99 {worst[2]:.0f} ms.")

    return _Spec("step-cdf", "step-cdf", "", 4.5, vmax, draw)


def _draw(spec: _Spec, out_dir: Path, limit: float | None = None) -> Plot:
    """Draw one spec to ``out_dir``/<name>.png and read back the words that ended up on it."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_IN, spec.height_in), dpi=DPI, layout="constrained")
    caption = spec.draw(fig, spec.vmax if limit is None else limit)
    ax = fig.axes[0]
    legend = ax.get_legend()
    cbar = next((a.get_ylabel() for a in fig.axes[1:] if a.get_ylabel()), "")
    file = f"{spec.name}.png"
    fig.savefig(out_dir / file, dpi=DPI, metadata={
        "Title": ax.get_title(), "Description": caption, "Software": "FabricLab lab.report"})
    width, height = fig.canvas.get_width_height()
    return Plot(name=spec.name, file=file, kind=spec.kind, section=spec.section,
                title=ax.get_title(), xlabel=ax.get_xlabel(), ylabel=ax.get_ylabel(),
                legend=[t.get_text() for t in legend.get_texts()] if legend else [],
                colorbar=cbar, caption=caption, width_px=width, height_px=height)


def make_plots(result: dict[str, Any], out_dir: Path,
               run_dir: Path | None = None,
               limits: dict[str, float] | None = None) -> tuple[list[Plot], list[Skipped]]:
    """Draw every plot ``result`` has data for into ``out_dir``; the made and the skipped.

    ``run_dir`` is where the players' timelines are (streaming); ``limits`` overrides the
    value-axis extent per plot name (a comparison draws both runs on one scale).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    specs, skipped = _specs(result, run_dir)
    made = [_draw(s, out_dir, (limits or {}).get(s.name)) for s in specs]
    return made, skipped


# --------------------------------------------------------------------------------------------
# Tables: values formatted once, for the HTML and the terminal alike
# --------------------------------------------------------------------------------------------


def _base_key(key: str) -> str:
    """The last part of a dotted key, without a note such as `` (sum)``."""
    return key.rsplit(".", 1)[-1].split(" (", 1)[0]


def _unit_of(key: str) -> str:
    k = _base_key(key)
    for suffix, unit in (("_bps", "Mbit/s"), ("_mbps", "Mbit/s"), ("_pct", "%"),
                         ("_ms", "ms"), ("_s", "s"), ("_bytes", "B")):
        if k.endswith(suffix):
            return unit
    return ""


def format_value(key: str, v: Any, signed: bool = False) -> str:
    """One value as a person reads it: units from the key's suffix, lists summarised."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int | float):
        unit = _unit_of(key)
        x = float(v) / 1e6 if unit == "Mbit/s" and _base_key(key).endswith("_bps") \
            else float(v)
        sign = "+" if signed else ""
        if isinstance(v, int) and unit != "Mbit/s":
            text = f"{v:{sign},}"
        elif unit == "Mbit/s":
            text = f"{x:{sign}.2f}"
        else:
            text = f"{x:{sign}.4g}"
        return f"{text} {unit}" if unit else text
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        if not v:
            return "none"
        if all(_num(x) is not None for x in v) and len(v) > 8:
            return f"{len(v)} values, {min(v):.4g} … {max(v):.4g}"
        if all(not isinstance(x, dict | list) for x in v):
            return ", ".join(format_value("", x) for x in v) if len(v) <= 12 \
                else f"{len(v)} items: " + ", ".join(str(x) for x in v[:6]) + ", …"
        return "; ".join(_compact(x) for x in v)
    if isinstance(v, dict):
        return _compact(v) if v else "none"
    return str(v)


def _compact(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}={_compact(x)}" for k, x in v.items())
    if isinstance(v, list):
        return "[" + ", ".join(_compact(x) for x in v) + "]"
    return format_value("", v)


def flatten(obj: dict[str, Any], prefix: str = "", depth: int = 2) -> list[tuple[str, Any]]:
    """Nested mappings as dotted keys, ``depth`` levels deep; deeper ones stay whole."""
    rows: list[tuple[str, Any]] = []
    for k, v in obj.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v and depth > 0:
            rows += flatten(v, key, depth - 1)
        else:
            rows.append((key, v))
    return rows


def _metric_rows(result: dict[str, Any]) -> list[tuple[str, Any]]:
    """The result's metrics as (dotted key, value); a phased result's as ``<phase>.<key>``.

    A collective result repeats its first phase's numbers at the top level: those appear
    once, under the phase.
    """
    metrics = _dict(result.get("metrics"))
    phases = _dict(metrics.get("phases"))
    first = _dict(next(iter(phases.values()), {}))
    rows = [(k, v) for k, v in flatten(
        {k: v for k, v in metrics.items() if k != "phases" and first.get(k, object()) != v})]
    for name, m in phases.items():
        rows += flatten(_dict(m), str(name), depth=1)
    return rows


def _totals(result: dict[str, Any]) -> list[tuple[str, Any]]:
    """Per section, totals a comparison needs even when the kind's metrics lack them."""
    rows: list[tuple[str, Any]] = [("duration_s", result.get("duration_s"))]
    for sec in sections(result):
        p = f"{sec.name}." if sec.name else ""
        rows += [
            (f"{p}flows.goodput_bps (sum)",
             sum(_num(f.get("goodput_bps")) or 0 for f in sec.flows) if sec.flows else None),
            (f"{p}flows.retransmits (sum)",
             sum(int(_num(f.get("retransmits")) or 0) for f in sec.flows)
             if sec.flows else None),
            (f"{p}links.drops (sum)",
             sum(int(_num(ln.get("drops")) or 0) for ln in sec.links) if sec.links else None),
            (f"{p}links.util_max (max)",
             max((_num(ln.get("util_max")) or 0 for ln in sec.links), default=None)),
        ]
    fid = _dict(result.get("fidelity"))
    rows += [("fidelity.valid", fid.get("valid")),
             ("fidelity.cpu_idle_min_pct", fid.get("cpu_idle_min_pct"))]
    return rows


def compare_rows(result_a: dict[str, Any],
                 result_b: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(metric, a, b, delta) for every metric either run has; delta is b − a.

    For the terminal (``fabriclab compare``) and compare.html alike. Numbers get a signed
    difference and, where a is not 0, the relative change; other values say whether they
    differ.
    """
    a_rows = dict(_metric_rows(result_a) + _totals(result_a))
    b_rows = dict(_metric_rows(result_b) + _totals(result_b))
    keys = list(dict.fromkeys([*a_rows, *b_rows]))
    out = []
    for key in keys:
        va, vb = a_rows.get(key), b_rows.get(key)
        if va is None and vb is None:
            continue
        out.append((key, format_value(key, va), format_value(key, vb),
                    _delta(key, va, vb, key in a_rows, key in b_rows)))
    return out


def _delta(key: str, va: Any, vb: Any, in_a: bool, in_b: bool) -> str:
    if not in_a:
        return "only in B"
    if not in_b:
        return "only in A"
    na, nb = _num(va), _num(vb)
    if na is not None and nb is not None:
        d = nb - na
        if d == 0:
            return "0"
        as_int = isinstance(va, int) and isinstance(vb, int)
        text = format_value(key, int(d) if as_int else d, signed=True)
        return f"{text} ({100 * d / abs(na):+.1f} %)" if na else text
    return "same" if va == vb else "differs"


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5em auto;
max-width:1160px;padding:0 1em;color:#222;line-height:1.4}
h1{font-size:1.5em;margin-bottom:.2em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;
margin-top:1.6em}h3{margin-bottom:.3em}.sub{color:#555;margin-top:0}
table{border-collapse:collapse;font-size:.85em;margin:.4em 0 1em}
th,td{border:1px solid #ddd;padding:.2em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr:nth-child(even) td{background:#fafafa}.bad{color:#b00020;font-weight:600}
.ok{color:#1b7e2a;font-weight:600}.diff td{background:#fff7e0!important}
figure{margin:1em 0 2em}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.9em;color:#333;max-width:800px}figcaption .axes{color:#666}
.wrap{overflow-x:auto}details{margin:.4em 0}summary{cursor:pointer;font-weight:600}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:1em}.pair figure{margin:0}
.muted{color:#777}nav a{margin-right:1em}
"""

#: The only script: count the images that decoded, for a headless browser to read back.
_SCRIPT = ("<script>window.addEventListener('load',function(){document.body.dataset.plots="
           "String(Array.prototype.filter.call(document.images,function(i){"
           "return i.complete&&i.naturalWidth>0;}).length);});</script>")


#: A cell that reads as a number (right-aligned); lists and names stay left-aligned.
_NUMERIC = re.compile(r"^[-+]?[\d.,]+( [^\s,]+)?( \([-+\d.]+ %\))?$")


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _table(head: Iterable[str], rows: Iterable[Iterable[Any]],
           numeric: Iterable[int] = ()) -> str:
    nums = set(numeric)
    out = ["<div class='wrap'><table><thead><tr>"]
    out += [f"<th>{_e(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for row in rows:
        cells = []
        for i, c in enumerate(row):
            cls = " class='n'" if i in nums and _NUMERIC.match(str(c)) else ""
            cells.append(f"<td{cls}>{c if isinstance(c, _Raw) else _e(c)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


class _Raw(str):
    """HTML already escaped (a table cell that carries markup)."""


def _kv_table(rows: list[tuple[str, Any]]) -> str:
    return _table(("field", "value"), ((k, format_value(k, v)) for k, v in rows))


def _img(plot: Plot, png: bytes) -> str:
    data = base64.b64encode(png).decode()
    return (f"<img src=\"data:image/png;base64,{data}\" alt=\"{_e(plot.title)}\" "
            f"width=\"{plot.width_px}\" height=\"{plot.height_px}\">")


def _figure(plot: Plot, png: bytes, caption: bool = True) -> str:
    axes = f"x: {plot.xlabel}; y: {plot.ylabel}" + \
        (f"; colour: {plot.colorbar}" if plot.colorbar else "")
    cap = (f"<figcaption><b>{_e(plot.title)}.</b> {_e(plot.caption)} "
           f"<span class='axes'>({_e(axes)})</span></figcaption>") if caption else ""
    return f"<figure id='plot-{_e(plot.name)}'>{_img(plot, png)}{cap}</figure>"


def _run_date(run_dir: Path) -> str:
    """When the run finished: result.json's ``finished`` (UTC), else its modification time
    (results written before the field existed)."""
    try:
        finished = json.loads((run_dir / "result.json").read_text()).get("finished")
        if isinstance(finished, str):
            when = dt.datetime.strptime(finished, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
            return when.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    except (OSError, ValueError, AttributeError):
        pass
    try:
        ts = (run_dir / "result.json").stat().st_mtime
    except OSError:
        return "unknown"
    return dt.datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def _heading(result: dict[str, Any]) -> str:
    return (f"{result.get('scenario', '?')} — policy {result.get('policy', '?')}, "
            f"seed {result.get('seed', '?')}")


def _env_rows(result: dict[str, Any]) -> list[tuple[str, Any]]:
    env = _dict(result.get("environment"))
    first = ("datapath", "ecn", "delay", "controller", "kernel")
    return [(k, env.get(k)) for k in first] + [(k, v) for k, v in env.items() if k not in first]


def _fidelity_html(result: dict[str, Any]) -> str:
    fid = _dict(result.get("fidelity"))
    valid = fid.get("valid")
    verdict = ("<p class='ok'>valid: the emulator kept up, the numbers describe the "
               "network</p>" if valid else
               "<p class='bad'>NOT valid: the CPU ran out, the numbers describe the "
               "emulator, not the network</p>" if valid is False else
               "<p class='muted'>no fidelity verdict in this result</p>")
    notes = fid.get("notes") or []
    note_html = "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>" if notes else ""
    rows = [(k, v) for k, v in flatten({k: v for k, v in fid.items()
                                        if k not in ("valid", "notes")})]
    return verdict + note_html + _kv_table(rows)


def _metrics_html(result: dict[str, Any]) -> str:
    """Top-level metrics as field/value; per-phase metrics as one table, phases as columns."""
    metrics = _dict(result.get("metrics"))
    phases = _dict(metrics.get("phases"))
    first = _dict(next(iter(phases.values()), {}))
    top = flatten({k: v for k, v in metrics.items()
                   if k != "phases" and first.get(k, object()) != v})
    parts = []
    if phases:
        names = list(phases)
        # Two levels: deeper per-phase detail (a phase's config, its predictions) is one
        # cell, not a row per key that only that phase has.
        flat = {n: dict(flatten(_dict(phases[n]), depth=1)) for n in names}
        keys = list(dict.fromkeys(k for n in names for k in flat[n]))
        parts.append("<h3>Per phase</h3>" + _table(
            ["metric", *names],
            ([k] + [format_value(k, flat[n].get(k)) if k in flat[n] else "" for n in names]
             for k in keys), numeric=range(1, len(names) + 1)))
    if top:
        parts.append(("<h3>Whole run</h3>" if phases else "")
                     + _table(("metric", "value"), ((k, format_value(k, v)) for k, v in top),
                              numeric=(1,)))
    return "".join(parts) or "<p class='muted'>no metrics</p>"


def _links_table(links: list[dict[str, Any]]) -> str:
    if not links:
        return "<p class='muted'>no links</p>"
    rows = []
    for ln, label in zip(links, _link_labels(links), strict=True):
        drops = int(_num(ln.get("drops")) or 0)
        rows.append((label, ln.get("role", ""), format_value("", ln.get("bw_mbps")),
                     f"{100 * (_num(ln.get('util_mean')) or 0):.1f}",
                     f"{100 * (_num(ln.get('util_max')) or 0):.1f}",
                     _Raw(f"<span class='bad'>{drops:,}</span>") if drops else "0",
                     f"{int(_num(ln.get('ce_marked')) or 0):,}",
                     f"{(_num(ln.get('tx_bytes')) or 0) / 1e6:.2f}"))
    return _table(("link", "role", "rate (Mbit/s)", "util mean (%)", "util max (%)", "drops",
                   "CE marked", "sent (MB)"), rows, numeric=range(2, 8))


def _flows_table(flows: list[dict[str, Any]]) -> str:
    if not flows:
        return "<p class='muted'>no flows</p>"
    streams = any("stalls" in f for f in flows)
    rows = []
    for f in flows:
        path = f.get("full_path") or f.get("path") or []
        row = [f.get("id", "?"), f.get("kind", ""), f"{f.get('src', '?')} → {f.get('dst', '?')}",
               " → ".join(str(p) for p in path) if isinstance(path, list) else str(path),
               f"{(_num(f.get('offered_bps')) or 0) / 1e6:.2f}",
               f"{(_num(f.get('goodput_bps')) or 0) / 1e6:.2f}",
               f"{int(_num(f.get('retransmits')) or 0):,}",
               f"{100 * (_num(f.get('loss')) or 0):.2f}"]
        if streams:
            row += [f.get("stalls", ""), format_value("", f.get("stall_s"))]
        rows.append(row)
    head = ["flow", "kind", "src → dst", "path", "offered (Mbit/s)", "goodput (Mbit/s)",
            "retransmits", "fabric loss (%)"] + (["stalls", "stall time (s)"] if streams else [])
    return _table(head, rows, numeric=range(4, len(head)))


def _per_section(result: dict[str, Any], render: Callable[[Section], str], what: str) -> str:
    secs = sections(result)
    if len(secs) == 1 and not secs[0].name:
        return render(secs[0])
    main = result.get("phase")
    return "".join(f"<details{' open' if s.name == main else ''}><summary>{_e(what)}, phase "
                   f"{_e(s.name)}{' (the headline phase)' if s.name == main else ''}"
                   f"</summary>{render(s)}</details>" for s in secs)


def _skipped_html(skipped: list[Skipped]) -> str:
    if not skipped:
        return ""
    return ("<details><summary>Plots not made</summary><ul>"
            + "".join(f"<li>{_e(s.name)}: {_e(s.reason)}</li>" for s in skipped)
            + "</ul></details>")


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head>"
            f"<body>{body}{_SCRIPT}</body></html>\n")


def report_html(result: dict[str, Any], plots: list[Plot], skipped: list[Skipped],
                plots_dir: Path, run_date: str = "unknown") -> str:
    """The report page for one run, with ``plots`` (PNGs in ``plots_dir``) embedded."""
    now = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    head = _heading(result)
    sub = (f"kind {kind_of(result)} · run finished {run_date} · measured "
           f"{format_value('duration_s', result.get('duration_s'))}"
           + (f" · phases: {', '.join(s.name for s in sections(result))}"
              if sections(result)[0].name else "")
           + f" · report made {now}")
    parts, phase = [], ""
    for p in plots:
        if p.section and p.section != phase:
            parts.append(f"<h3>Phase {_e(p.section)}</h3>")
            phase = p.section
        parts.append(_figure(p, (plots_dir / p.file).read_bytes()))
    figures = "".join(parts) or "<p class='muted'>no plots: the result holds no series to draw</p>"
    params = _dict(result.get("params"))
    timings = _dict(result.get("timings"))
    body = (
        f"<h1>FabricLab report: {_e(head)}</h1><p class='sub'>{_e(sub)}</p>"
        "<nav><a href='#environment'>environment</a><a href='#fidelity'>fidelity</a>"
        "<a href='#plots'>plots</a><a href='#metrics'>metrics</a><a href='#links'>links</a>"
        "<a href='#flows'>flows</a></nav>"
        f"<h2 id='environment'>Environment</h2>{_kv_table(_env_rows(result))}"
        + (f"<details><summary>Scenario parameters</summary>{_kv_table(flatten(params, depth=3))}"
           "</details>" if params else "")
        + (f"<details><summary>Timings</summary>{_kv_table(flatten(timings))}</details>"
           if timings else "")
        + f"<h2 id='fidelity'>Fidelity</h2>{_fidelity_html(result)}"
        # Plots before the metrics: a phased run's metrics table is 60-100 rows, and the
        # plots are what a reader opens the report for.
        f"<h2 id='plots'>Plots</h2>{figures}{_skipped_html(skipped)}"
        f"<h2 id='metrics'>Metrics</h2>{_metrics_html(result)}"
        f"<h2 id='links'>Links</h2><p>One row per switch or router egress port.</p>"
        f"{_per_section(result, lambda s: _links_table(s.links), 'Links')}"
        f"<h2 id='flows'>Flows</h2>"
        f"{_per_section(result, lambda s: _flows_table(s.flows), 'Flows')}")
    return _page(f"FabricLab: {head}", body)


def write_report(run_dir: Path) -> Path:
    """Plots into ``run_dir``/plots/ and a self-contained ``run_dir``/report.html; its path.

    ``plots/index.json`` lists the plots made (titles, axis labels, captions) and those not
    made with the reason. Raises ReportError when there is no readable result.json.
    """
    run_dir = Path(run_dir)
    result = load_result(run_dir)
    plots_dir = run_dir / PLOTS_DIR
    plots_dir.mkdir(exist_ok=True)
    for old in plots_dir.glob("*.png"):      # a previous report's plots may not apply now
        old.unlink()
    plots, skipped = make_plots(result, plots_dir, run_dir)
    (plots_dir / "index.json").write_text(json.dumps(
        {"plots": [asdict(p) for p in plots], "skipped": [asdict(s) for s in skipped]},
        indent=1) + "\n")
    out = run_dir / REPORT_NAME
    out.write_text(report_html(result, plots, skipped, plots_dir, _run_date(run_dir)))
    return out


# --------------------------------------------------------------------------------------------
# Two runs side by side
# --------------------------------------------------------------------------------------------


def write_compare(dir_a: Path, dir_b: Path, out: Path) -> Path:
    """A self-contained compare.html of two runs; ``out`` is the file or its directory.

    The metrics table has both values and b − a; plots of the same name stand side by side,
    drawn on the same axis limits so that a taller bar is a bigger number. The runs'
    directories are only read: the plots are drawn in a temporary directory and embedded.
    """
    dir_a, dir_b, out = Path(dir_a), Path(dir_b), Path(out)
    ra, rb = load_result(dir_a), load_result(dir_b)
    path = out if out.suffix.lower() in (".html", ".htm") else out / COMPARE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    specs_a, skip_a = _specs(ra, dir_a)
    specs_b, skip_b = _specs(rb, dir_b)
    limits = {s.name: s.vmax for s in specs_a}
    for s in specs_b:
        limits[s.name] = max(limits.get(s.name, s.vmax), s.vmax)
    with tempfile.TemporaryDirectory(prefix="fabriclab-compare-") as tmp:
        da, db = Path(tmp) / "a", Path(tmp) / "b"
        da.mkdir()
        db.mkdir()
        plots_a = {s.name: _draw(s, da, limits[s.name]) for s in specs_a}
        plots_b = {s.name: _draw(s, db, limits[s.name]) for s in specs_b}
        pngs = {("a", n): (da / p.file).read_bytes() for n, p in plots_a.items()}
        pngs |= {("b", n): (db / p.file).read_bytes() for n, p in plots_b.items()}
    why_a = {s.name: s.reason for s in skip_a}
    why_b = {s.name: s.reason for s in skip_b}
    path.write_text(compare_html(ra, rb, dir_a, dir_b, plots_a, plots_b, pngs, why_a, why_b))
    return path


def _side(result: dict[str, Any], run_dir: Path, tag: str) -> str:
    return (f"<b>{tag}</b>: {_e(_heading(result))} <span class='muted'>({_e(run_dir)}, "
            f"finished {_e(_run_date(run_dir))})</span>")


def compare_html(ra: dict[str, Any], rb: dict[str, Any], dir_a: Path, dir_b: Path,
                 plots_a: dict[str, Plot], plots_b: dict[str, Plot],
                 pngs: dict[tuple[str, str], bytes],
                 why_a: dict[str, str], why_b: dict[str, str]) -> str:
    """The compare page: who is A and B, what differs in set-up, metrics, plots in pairs."""
    label_a = f"A: {ra.get('policy', '?')}"
    label_b = f"B: {rb.get('policy', '?')}"
    if ra.get("policy") == rb.get("policy"):
        label_a += f" (seed {ra.get('seed', '?')})"
        label_b += f" (seed {rb.get('seed', '?')})"
    warn = ""
    if ra.get("scenario") != rb.get("scenario"):
        warn = ("<p class='bad'>Different scenarios: the numbers need not be comparable.</p>")
    env_a, env_b = dict(_env_rows(ra)), dict(_env_rows(rb))
    env_rows = [(k, format_value(k, env_a.get(k)), format_value(k, env_b.get(k)))
                for k in dict.fromkeys([*env_a, *env_b])]
    fa, fb = _dict(ra.get("fidelity")), _dict(rb.get("fidelity"))
    for key in ("valid", "cpu_idle_min_pct"):
        env_rows.append((f"fidelity.{key}", format_value(key, fa.get(key)),
                         format_value(key, fb.get(key))))
    rows = compare_rows(ra, rb)
    metric_rows = "".join(
        f"<tr{' class=diff' if d not in ('0', 'same') else ''}><td>{_e(m)}</td>"
        f"<td class='n'>{_e(a)}</td><td class='n'>{_e(b)}</td><td class='n'>{_e(d)}</td></tr>"
        for m, a, b, d in rows)
    metrics = ("<div class='wrap'><table><thead><tr><th>metric</th>"
               f"<th>{_e(label_a)}</th><th>{_e(label_b)}</th><th>Δ (B − A)</th></tr></thead>"
               f"<tbody>{metric_rows}</tbody></table></div>")
    names = list(dict.fromkeys([*plots_a, *plots_b]))
    pairs = []
    for n in names:
        cells = []
        for tag, plots, why in (("a", plots_a, why_a), ("b", plots_b, why_b)):
            p = plots.get(n)
            cells.append(_figure(p, pngs[(tag, n)], caption=False) if p else
                         f"<p class='muted'>not made for this run: "
                         f"{_e(why.get(n, 'no such data'))}</p>")
        p = plots_a.get(n) or plots_b[n]
        cap_a = plots_a[n].caption if n in plots_a else ""
        cap_b = plots_b[n].caption if n in plots_b else ""
        pairs.append(f"<h3>{_e(p.title)}</h3><div class='pair'><div><p><b>{_e(label_a)}</b>"
                     f"</p>{cells[0]}<p class='muted'>{_e(cap_a)}</p></div><div><p><b>"
                     f"{_e(label_b)}</b></p>{cells[1]}<p class='muted'>{_e(cap_b)}</p>"
                     "</div></div>")
    body = (f"<h1>FabricLab compare: {_e(ra.get('scenario', '?'))} — {_e(label_a)} vs "
            f"{_e(label_b)}</h1><p>{_side(ra, dir_a, 'A')}<br>{_side(rb, dir_b, 'B')}</p>"
            f"{warn}<h2>Set-up</h2>"
            + _table(("field", label_a, label_b), env_rows)
            + "<h2>Metrics</h2><p>Rows where the runs differ are shaded; Δ is B − A, with "
              "the change relative to A in brackets.</p>" + metrics
            + "<h2>Plots</h2><p>Each pair is drawn on the same axis limits.</p>"
            + ("".join(pairs) or "<p class='muted'>no plots</p>"))
    return _page(f"FabricLab compare: {ra.get('scenario', '?')} {label_a} vs {label_b}", body)
