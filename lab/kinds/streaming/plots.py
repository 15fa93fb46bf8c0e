"""The streaming kind's plots: viewers' stalls per phase, and per phase when each stream
stalled (from the players' own timelines where the run kept them).

Specifications only (``lab.plotting``); ``lab.report`` draws them after the plots every
run gets.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from lab.kinds.streaming.metrics import viewed
from lab.plotting.plots import Skipped, Spec, spec_name, spec_title
from lab.plotting.sections import Section, dict_of, dicts_of, flow_label, num


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
        for s in dicts_of(dict_of(play).get("streams")):
            if isinstance(s.get("stream_id"), int):
                out[(path.name.removesuffix(".play.json"), s["stream_id"])] = s
    return out


def _stall_spec(sec: Section, run_dir: Path | None) -> Spec | Skipped:
    """Per stream, when it played and when it stalled, on the phase's clock.

    Drawn from the players' timelines where the run has them; otherwise from the stall
    totals in result.json.
    """
    name = spec_name("stalls", sec)
    # A relay has no viewer to stall (real media): its delivery is its stream's.
    streams = [f for f in viewed(sec.flows) if f.get("kind") == "stream"]
    if not streams:
        return Skipped(name, f"{sec.label}: no streams")
    rows = _playouts(streams, _player_streams(run_dir, sec.name))
    title = spec_title("Stream stalls", sec)
    summary = _stall_summary(streams)
    if not rows:
        return _stall_totals_spec(name, sec, streams, title, summary)
    return _stall_timeline_spec(name, sec, rows, title, summary)


def _playouts(streams: list[dict[str, Any]], players: dict[tuple[str, int], dict[str, Any]]
              ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(stream, its player's timeline) for every stream whose timeline is known."""
    rows = []
    for f in streams:
        # The result's own copy of the player's timeline; older results only have it in
        # the players' files, matched by the stream number at the end of the flow id.
        p = dict_of(f.get("playout")) or None
        if p is None or num(p.get("first_arrival_unix")) is None:
            m = re.search(r"(\d+)$", str(f.get("id", "")))
            p = players.get((str(f.get("dst")), int(m.group(1)))) if m else None
        if p is not None and num(p.get("first_arrival_unix")) is not None:
            rows.append((f, p))
    return rows


def _stall_summary(streams: list[dict[str, Any]]) -> str:
    """The caption's last sentence: how many stalls, how long in all, on which streams."""
    total = sum(int(num(f.get("stalls")) or 0) for f in streams)
    total_s = sum(num(f.get("stall_s")) or 0 for f in streams)
    stalled = [flow_label(f) for f in streams if (num(f.get("stalls")) or 0) > 0]
    return (f"{total} stalls, {total_s:.1f} s in all"
            + (f", on {', '.join(stalled)}." if stalled else ": no viewer saw a stall."))


def _stall_totals_spec(name: str, sec: Section, streams: list[dict[str, Any]], title: str,
                       summary: str) -> Spec:
    """Seconds stalled per stream: all that is known without the players' files."""
    stall_s = [num(f.get("stall_s")) or 0 for f in streams]

    def draw_totals(fig: Any, limit: float) -> str:
        ax = fig.add_subplot()
        ax.barh(range(len(streams)), stall_s, color="#d62728", label="stall time")
        ax.set_yticks(list(range(len(streams))))
        ax.set_yticklabels([flow_label(f) for f in streams], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(limit, 1.0) * 1.1)
        ax.set_title(title + " (totals; the players' timelines are not in this run)")
        ax.set_xlabel("time stalled (s)")
        ax.set_ylabel("stream")
        ax.legend(fontsize=8)
        return ("Seconds each viewer's playback was frozen waiting for media (the "
                "players' per-stall timelines were not found, so only totals). " + summary)

    return Spec(name, "stalls", sec.name, max(3.0, 0.3 * len(streams) + 1.5),
                 max(stall_s), draw_totals)


#: One stream's row in the stall timeline: label, when it joined, its start-up delay, the
#: end of its playback (both relative to joining) and its stalls as (start, duration).
_StallBar = tuple[str, float, float | None, float | None, list[tuple[float, float]]]


def _stall_clock(sec: Section, rows: list[tuple[dict[str, Any], dict[str, Any]]]
                 ) -> tuple[float, str]:
    """The timeline's zero (unix time) and its axis label: the phase's start, or the phase's
    first frame in results that do not record the start."""
    t0 = num(sec.events.get("phase_start_unix"))
    clock = "time since the phase started (s)"
    if t0 is None:
        t0 = min(float(p["first_arrival_unix"]) for _, p in rows)
        clock = "time since the phase's first frame arrived (s)"
    return t0, clock


def _stall_bars(rows: list[tuple[dict[str, Any], dict[str, Any]]],
                t0: float) -> list[_StallBar]:
    """Each stream's playout on the clock that starts at ``t0``."""
    bars = []
    for f, p in rows:
        join = float(num(p.get("join_unix")) or p["first_arrival_unix"]) - t0
        startup = num(p.get("startup_delay_s"))
        end = num(p.get("play_end_s"))
        stalls = [(join + float(e["start_s"]), float(e["duration_s"]))
                  for e in dicts_of(p.get("stall_events"))
                  if num(e.get("start_s")) is not None and num(e.get("duration_s"))]
        bars.append((flow_label(f), join, startup, end, stalls))
    return bars


def _stall_marks(sec: Section, t0: float) -> list[tuple[float, str]]:
    """The failover's cut and restore, where the phase had them, on the same clock."""
    cut = num(sec.events.get("cut_unix"))
    restore = num(sec.events.get("restore_unix"))
    return [(x - t0, lab) for x, lab in ((cut, f"cut {sec.events.get('cut', '')}"),
                                         (restore, "restored")) if x is not None]


def _stall_timeline_spec(name: str, sec: Section,
                         rows: list[tuple[dict[str, Any], dict[str, Any]]], title: str,
                         summary: str) -> Spec:
    """One row per stream from its first frame to the end of playback, stalls in red."""
    t0, clock = _stall_clock(sec, rows)
    bars = _stall_bars(rows, t0)
    marks = _stall_marks(sec, t0)
    vmax = max([j + (e or s or 0) for _, j, s, e, _ in bars] + [m[0] for m in marks] + [0.0])

    uplinks = _uplink_series(sec, t0)

    def draw(fig: Any, limit: float) -> str:
        from matplotlib.patches import Patch
        if uplinks:
            top, ax = fig.subplots(2, 1, sharex=True,
                                   gridspec_kw={"height_ratios": [1, max(1.5, 0.25 * len(bars))]})
            for label, t, util, drops in uplinks:
                top.plot(t, util, lw=1.2, label=label + (f" ({drops} drops)" if drops else ""))
            top.axhline(1.0, color="black", lw=0.8, ls=":")
            top.set_ylabel("uplink util.")
            top.set_ylim(0, 1.15)
            top.legend(fontsize=6, loc="upper right", ncols=2)
            top.grid(alpha=0.3)
        else:
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
        (fig.axes[0]).set_title(title)
        ax.set_xlabel(clock)
        ax.set_ylabel("stream")
        ax.legend(handles=handles, fontsize=7, loc="upper center", ncols=len(handles),
                  bbox_to_anchor=(0.5, -0.13 if len(bars) > 6 else -0.2))
        ax.grid(axis="x", alpha=0.3)
        extra = " The dashed lines are the failover's cut and restore." if marks else ""
        if uplinks:
            extra += (" Above, on the same clock, each uplink that carried traffic: its "
                      "utilisation (1.0 is its rate) and its drops over the phase.")
        return ("One row per stream, from its first frame to the end of playback: red is "
                "time the viewer's picture was frozen while the player rebuffered. Stalls "
                "that line up across streams point at one shared link or event." + extra
                + " " + summary)

    height = max(3.0, 0.3 * len(bars) + 1.6) + (1.6 if uplinks else 0.0)
    return Spec(name, "stalls", sec.name, height, vmax, draw)


def _uplink_series(sec: Section, t0: float) -> list[tuple[str, list[float], list[float], int]]:
    """The border routers' uplinks that carried traffic in the phase: (name, times on the
    stall timeline's clock, utilisation, drops). Their series start at the phase's window,
    which opened at ``phase_start_unix``; without it they cannot share the clock."""
    start = num(sec.events.get("phase_start_unix"))
    if start is None:
        return []
    out = []
    for ln in sec.links:
        series = dict_of(ln.get("series"))
        bw = num(ln.get("bw_mbps"))
        if ln.get("role") != "uplink" or not str(ln.get("node", "")).startswith("border") \
                or not bw or not num(ln.get("util_mean")):
            continue
        t = [float(x) + start - t0 for x in series.get("t") or []]
        util = [float(b) / (bw * 1e6) for b in series.get("tx_bps") or []]
        if t and max(util, default=0.0) > 0.05:
            out.append((str(ln.get("name")), t, util, int(num(ln.get("drops")) or 0)))
    return out


def _stall_phases_spec(secs: list[Section]) -> Spec | Skipped:
    """Stall seconds (and stall count) per phase: the streaming scenario's story in one plot."""
    rows = [(s.name, num(s.metrics.get("stall_s")), int(num(s.metrics.get("stalls")) or 0))
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

    return Spec("stall-phases", "stall-phases", "", 4.0, vmax, draw)


def run_plots(result: dict[str, Any], secs: list[Section]) -> list[Spec | Skipped | None]:
    """Plots of the whole run, before the per-phase ones."""
    return [_stall_phases_spec(secs)]


def section_plots(sec: Section, run_dir: Path | None) -> list[Spec | Skipped | None]:
    """Plots of one phase, after the ones every run gets."""
    return [_stall_spec(sec, run_dir)]
