"""The gpu-wait picture: every rank's steps, part by part, above the utilisation of the links
its job used, on one time axis, with the diagnosis' causes in the title.

Why one figure and not the shares alone: a share says how much of the step went to data
wait, not when, nor what the network was doing meanwhile. Laid on the links' own clock, a
step whose data wait lines up with a storage link pinned at 100 % (or queueing to its limit)
is the network's; one whose data wait lines up with idle links is the input pipeline's.

The clock: a rank stamps its steps with ``time.monotonic`` (the head's, over a cluster), the
links' series are seconds since the phase's measurement window opened, and the phase keeps
where that was on the ranks' clock (``phase_details.<phase>.t_window_start``), so a rank's
time t is at t - t_window_start on the links' axis.

Which links: the switch egress ports the job's connections crossed (``allreduce`` and
``loader`` flows, both directions: a loader's batches come back along its reverse path),
read from each flow's path and matched against the phase's ``links``. A storage host's own
egress (where a slow storage link queues its batches) is no switch port and has no series;
the diagnosis' mean utilisation of it over the phase is drawn as a flat dashed line.

A specification only (``lab.plotting.plots.Spec``), built from result.json alone.
"""

from __future__ import annotations

import itertools
from typing import Any

from lab.plotting.plots import Skipped, Spec
from lab.plotting.sections import dict_of, dicts_of, link_labels, num, slug

#: A step's parts in the order a step lives them: (key in a step row, legend, colour). The
#: live page colours its rank lanes the same (``lab/report/live.html``).
PARTS = (("data_wait_s", "data wait", "#ff7f0e"), ("compute_s", "compute", "#2ca02c"),
         ("exposed_comm_s", "exposed communication", "#d62728"),
         ("barrier_s", "barrier / straggler wait", "#9467bd"))
#: The links' line colours: none of the parts' colours, so a line is never read as a part.
LINK_COLOURS = ("#1f77b4", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79",
                "#000000", "#637939", "#843c39")
#: The connections whose links the picture shows.
JOB_FLOWS = ("allreduce", "loader")
#: A queue at this share of its limit or more is near full: where drops come from.
NEAR_FULL = 0.8
#: At most this many links get a line (the busiest); the caption says how many were left out.
MAX_LINKS = 8

#: One rank's spans: (part key, start, end), seconds since the window opened, warm-up or not.
Span = tuple[str, float, float, bool]


def rank_spans(details: dict[str, Any]) -> list[tuple[int, list[Span]]]:
    """Per rank, each step's parts as spans on the links' clock (from its start, one after
    the other: the rank stamped each boundary once, so they are contiguous)."""
    zero = num(details.get("t_window_start"))
    if zero is None:
        return []
    out = []
    for rk in dicts_of(dict_of(details.get("gpu_wait")).get("ranks")):
        spans: list[Span] = []
        for st in dicts_of(rk.get("steps")):
            t = num(st.get("t_start"))
            if t is None:
                continue
            t -= zero
            for key, _, _ in PARTS:
                d = num(st.get(key)) or 0.0
                spans.append((key, t, t + d, bool(st.get("warmup"))))
                t += d
        if spans:
            out.append((int(rk.get("rank", len(out))), spans))
    return out


def job_links(links: list[dict[str, Any]], flows: list[dict[str, Any]]
              ) -> list[dict[str, Any]]:
    """The egress ports (``links`` entries) the job's flows crossed, either direction."""
    hops: set[tuple[str, str]] = set()
    for f in flows:
        if f.get("kind") not in JOB_FLOWS:
            continue
        src, dst = str(f.get("src")), str(f.get("dst"))
        for path, a, b in ((f.get("path"), src, dst), (f.get("reverse_path"), dst, src)):
            if isinstance(path, list) and path:
                hops |= set(itertools.pairwise([a, *map(str, path), b]))
    return [ln for ln in links if (str(ln.get("node")), str(ln.get("peer"))) in hops]


def link_rows(links: list[dict[str, Any]], queue_limit: float | None) -> list[dict[str, Any]]:
    """Each link's utilisation series (% of its rate) and the sample times its queue was
    near full, busiest first."""
    rows = []
    for ln, label in zip(links, link_labels(links), strict=True):
        s = dict_of(ln.get("series"))
        t, bps, bw = s.get("t") or [], s.get("tx_bps") or [], num(ln.get("bw_mbps"))
        if not t or len(t) != len(bps) or not bw:
            continue
        q = s.get("queue_bytes")
        full = [float(x) for x, b in zip(t, q, strict=True)
                if queue_limit and b >= NEAR_FULL * queue_limit] \
            if isinstance(q, list) and len(q) == len(t) else []
        util = [100 * (num(b) or 0.0) / (bw * 1e6) for b in bps]
        rows.append({"label": label, "t": [float(x) for x in t], "util": util,
                     "drops": int(num(ln.get("drops")) or 0), "full": full,
                     "mean": sum(util) / len(util)})
    return sorted(rows, key=lambda r: -r["mean"])


def storage_hosts(diag: dict[str, Any]) -> list[dict[str, Any]]:
    """The diagnosis' storage links with a utilisation: each storage host's loader bytes
    over the phase against its own link's rate. The host's egress, where its batches queue,
    is not a switch port, so the sampler has no series of it: only this mean."""
    return [{"host": str(s.get("host")), "util": u, "bw_mbps": num(s.get("bw_mbps")) or 0.0}
            for s in dicts_of(diag.get("storage_links"))
            if (u := num(s.get("util"))) is not None]


def cause_words(diag: dict[str, Any]) -> str:
    """The diagnosis' named causes with their shares of the step, or what it found none."""
    named = diag.get("named")
    if not isinstance(named, list):
        return "no diagnosis in the result"
    if not named:
        return "nothing beyond the all-reduce's own time"
    share = {c.get("cause"): num(c.get("share_of_step")) or 0.0
             for c in dicts_of(diag.get("causes"))}
    return ", ".join(f"{c} ({100 * share.get(c, 0.0):.0f} % of the step)" for c in named)


def timeline_spec(result: dict[str, Any], phase: str) -> Spec | Skipped:
    """The picture of one phase with the ranks' step parts."""
    name = f"gpu-wait-timeline-{slug(phase)}"
    details = dict_of(dict_of(result.get("phase_details")).get(phase))
    ranks = rank_spans(details)
    if not ranks:
        why = "no t_window_start (a result from before it was kept)" \
            if "t_window_start" not in details else "no step has a start time"
        return Skipped(name, f"phase {phase}: {why}")
    queue_limit = num(dict_of(dict_of(result.get("params")).get("topology")).get("queue_bytes"))
    used = job_links(dicts_of(details.get("links")), dicts_of(details.get("flows")))
    rows = link_rows(used, queue_limit)
    if not rows:
        return Skipped(name, f"phase {phase}: none of the job's links has a tx_bps series")
    shown, left_out = rows[:MAX_LINKS], len(rows) - MAX_LINKS
    diag = dict_of(dict_of(dict_of(result.get("diagnosis")).get("gpu_wait")).get(phase))
    causes = cause_words(diag)
    hosts = storage_hosts(diag)
    t_end = max([num(details.get("duration_s")) or 0.0,
                 *(s[2] for _, spans in ranks for s in spans)])
    vmax = max(max(r["util"]) for r in shown)

    def draw(fig: Any, limit: float) -> str:
        top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[
            0.5 * len(ranks) + 0.6, 2.6])
        colour = {key: c for key, _, c in PARTS}
        for i, (_, spans) in enumerate(ranks):
            for key, a, b, warm in spans:
                if b > a:
                    top.barh(i, b - a, left=a, height=0.7, color=colour[key],
                             alpha=0.45 if warm else 1.0, lw=0)
        from matplotlib.patches import Patch
        handles = [Patch(color=c, label=label) for _, label, c in PARTS]
        top.set_yticks(range(len(ranks)), [f"rank {r}" for r, _ in ranks])
        top.set_ylim(len(ranks) - 0.4, -0.6)
        top.set_ylabel("rank (step parts)")
        top.set_title(f"Who made the GPUs wait — phase {phase}: {causes}", fontsize=10)
        top.legend(handles=handles, fontsize=7, ncols=4, loc="lower center",
                   bbox_to_anchor=(0.5, 1.12), frameon=False)
        top.grid(alpha=0.3, axis="x")
        xlabel = "time since the phase's measurement window opened (s)"
        top.set_xlabel(xlabel)
        top.xaxis.label.set_visible(False)   # the shared axis is labelled once, below
        for r, c in zip(shown, LINK_COLOURS, strict=False):
            drops = f", {r['drops']} drops" if r["drops"] else ""
            bottom.plot(r["t"], r["util"], lw=2.0 if r["drops"] else 1.1, color=c,
                        label=f"{r['label']} (mean {r['mean']:.0f} %{drops})")
            if r["full"]:
                at = dict(zip(r["t"], r["util"], strict=True))
                bottom.plot(r["full"], [at[x] for x in r["full"]], ls="none", marker="x",
                            ms=5, color=c)
        for h, c in zip(hosts, LINK_COLOURS[::-1], strict=False):
            bottom.plot([0, t_end], [100 * h["util"]] * 2, ls="--", lw=1.4, color=c,
                        label=f"{h['host']}'s own egress ({h['bw_mbps']:g} Mbit/s): "
                              f"{100 * h['util']:.0f} % over the phase")
        bottom.axhline(100, color="grey", lw=0.8, ls="--")
        bottom.set_ylim(0, max(105.0, limit * 1.05))
        bottom.set_xlim(0, t_end * 1.01)
        bottom.set_xlabel(xlabel)
        bottom.set_ylabel("link utilisation (%)")
        bottom.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        bottom.grid(alpha=0.3)
        dropped = [r["label"] for r in rows if r["drops"]]
        full = [r["label"] for r in shown if r["full"]]
        return (f"Each rank's steps, part by part (warm-up steps pale), above the "
                f"utilisation of the {len(rows)} switch ports its all-reduce and loader "
                f"connections crossed, on one clock"
                + (f" (the {MAX_LINKS} busiest shown)" if left_out > 0 else "")
                + ". A data wait that lines up with a link at 100 % is the network's; one "
                "beside idle links is the input pipeline's. Thick lines are ports that "
                f"dropped ({', '.join(dropped) if dropped else 'none did'}); an x marks a "
                f"sample whose queue was at {NEAR_FULL * 100:.0f} % of its limit or more "
                f"({', '.join(full) if full else 'none was'})."
                + (" A storage host's own egress is not a switch port, so it has no series: "
                   "its dashed line is its loader flows' bytes over the phase against its "
                   "link's rate (the diagnosis' storage link)." if hosts else "")
                + f" Diagnosis: {causes}.")

    height = 1.9 + 0.5 * len(ranks) + 2.8
    return Spec(name, "gpu-wait-timeline", phase, height, vmax, draw)


def timeline_specs(result: dict[str, Any]) -> list[Spec | Skipped]:
    """One picture per phase with the ranks' step parts, in run order."""
    details = dict_of(result.get("phase_details"))
    return [timeline_spec(result, name) for name, d in details.items()
            if dict_of(d).get("gpu_wait")]
