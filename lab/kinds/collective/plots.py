"""The collective kind's plots: the distribution of step times, phase beside phase; a
sweep's busbw against size; a DDP job's step, part by part; with a data loader, each
phase's ranks step by step above its links (``gpuplot``).

Specifications only (``lab.plotting``); ``lab.report`` draws them before the plots every
run gets.
"""

from __future__ import annotations

from typing import Any

from lab.kinds.collective import gpuplot
from lab.model.stats import percentile
from lab.plotting.plots import Skipped, Spec
from lab.plotting.sections import Section, dict_of, dicts_of, num


def _step_times(result: dict[str, Any], secs: list[Section]) -> list[tuple[str, list[float]]]:
    """Measured (non-warm-up) step times per phase, in ms."""
    series = [(s.name, s.metrics.get("step_series")) for s in secs if s.name]
    if not any(isinstance(x, list) for _, x in series):
        series = [("job", dict_of(result.get("metrics")).get("step_series"))]
    out = []
    for name, steps in series:
        ms = [1000 * v for st in dicts_of(steps)
              if not st.get("warmup") and (v := num(st.get("step_s"))) is not None]
        if ms:
            out.append((name, ms))
    return out


def _step_cdf_spec(result: dict[str, Any], secs: list[Section]) -> Spec | Skipped:
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

    return Spec("step-cdf", "step-cdf", "", 4.5, vmax, draw)


def _sweep_spec(result: dict[str, Any], secs: list[Section]) -> Spec | None:
    """busbw against message size per sweep phase (nccl-tests' curve), with the ideal: a
    ring at its bottleneck rate has busbw = B whatever the size."""
    phases = [(s.name or "job", dicts_of(s.metrics.get("sweep"))) for s in secs]
    phases = [(n, rows) for n, rows in phases if rows]
    if not phases:
        return None
    ideal = max(num(r.get("ideal_busbw_bps")) or 0.0 for _, rows in phases for r in rows)
    vmax = max(ideal, *(num(r.get("busbw_bps")) or 0.0 for _, rows in phases
                        for r in rows)) / 1e6

    def draw(fig: Any, limit: float) -> str:
        ax = fig.add_subplot()
        sizes = sorted({int(num(r.get("size_bytes")) or 0) for _, rows in phases
                        for r in rows})
        for name, rows in phases:
            xs = [num(r.get("size_bytes")) or 0 for r in rows]
            ys = [(num(r.get("busbw_bps")) or 0) / 1e6 for r in rows]
            ax.plot(xs, ys, marker="o", lw=1.5, label=name)
        ax.plot(sizes, [ideal / 1e6] * len(sizes), ls="--", color="grey",
                label=f"ideal: B = {ideal / 1e6:.0f} Mbit/s")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, limit * 1.1)
        ax.set_title("All-Reduce bus bandwidth against message size")
        ax.set_xlabel("message size S (bytes)")
        ax.set_ylabel("busbw (Mbit/s)")
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3)
        text = "; ".join(
            f"{name}: {(num(rows[0].get('busbw_bps')) or 0) / 1e6:.1f} Mbit/s at "
            f"{int(num(rows[0].get('size_bytes')) or 0) // 1024} KiB, "
            f"{(num(rows[-1].get('busbw_bps')) or 0) / 1e6:.1f} at "
            f"{int(num(rows[-1].get('size_bytes')) or 0) // 1024} KiB" for name, rows in phases)
        return ("busbw = S/t · 2(N−1)/N, as nccl-tests reports it, for each size of the "
                "sweep (median of its measured steps). Small messages are latency: a ring "
                "takes 2(N−1) round trips whatever S is, so busbw is low. Large ones "
                f"approach the link rate, the dashed line. {text}.")

    return Spec("allreduce-sweep", "allreduce-sweep", "", 4.5, vmax, draw)


def _ddp_spec(secs: list[Section]) -> Spec | None:
    """A DDP phase's step, p50 of each part: forward, backward, and the all-reduce left
    exposed after backward; the overlap beside it."""
    phases = [(s.name or "job", dict_of(s.metrics.get("ddp"))) for s in secs]
    phases = [(n, d) for n, d in phases if d]
    if not phases:
        return None
    parts = [("forward", "fwd_p50_s", "tab:blue"), ("backward", "bwd_p50_s", "tab:green"),
             ("exposed all-reduce", "exposed_comm_p50_s", "tab:red")]
    ms = [[1000 * (num(d.get(k)) or 0.0) for _, k, _ in parts] for _, d in phases]
    vmax = max(sum(row) for row in ms)

    def draw(fig: Any, limit: float) -> str:
        ax = fig.add_subplot()
        ys = list(range(len(phases)))[::-1]
        left = [0.0] * len(phases)
        for i, (label, _, color) in enumerate(parts):
            widths = [row[i] for row in ms]
            ax.barh(ys, widths, left=left, color=color, label=label, height=0.6)
            left = [a + w for a, w in zip(left, widths, strict=True)]
        for y, (_, d), end in zip(ys, phases, left, strict=True):
            b = d.get("buckets")
            ax.text(end + limit * 0.01, y, f"{b} bucket{'' if b == 1 else 's'}, "
                    f"{(num(d.get('overlap_fraction')) or 0) * 100:.0f}% overlapped",
                    va="center", fontsize=8)
        ax.set_yticks(ys, [n for n, _ in phases])
        ax.set_xlim(0, limit * 1.45)
        ax.set_title("DDP step, p50 of each part")
        ax.set_xlabel("time (ms)")
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3, axis="x")
        text = "; ".join(f"{n}: all-reduce {1000 * (num(d.get('comm_p50_s')) or 0):.0f} ms, "
                         f"{1000 * (num(d.get('exposed_comm_p50_s')) or 0):.0f} exposed"
                         for n, d in phases)
        return ("Each DDP step: forward, backward's compute, then the part of the gradients' "
                "all-reduce still running when backward ended (the GPU idle, waiting for "
                "the network). DDP all-reduces each bucket as soon as backward has produced "
                "it, so the rest of the all-reduce ran during backward (the overlap). "
                f"{text}.")

    return Spec("ddp-steps", "ddp-steps", "", 1.2 + 0.6 * len(phases), vmax, draw)


def run_plots(result: dict[str, Any], secs: list[Section]) -> list[Spec | Skipped | None]:
    """Plots of the whole run, before the per-phase ones."""
    return [_step_cdf_spec(result, secs), _sweep_spec(result, secs), _ddp_spec(secs),
            *gpuplot.timeline_specs(result)]
