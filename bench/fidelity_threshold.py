"""Where, on this machine, a run's numbers start to drift as CPU is taken away from it.

``fidelity.valid`` trusts a run whose least idle CPU second kept at least
``headroom.MIN_CPU_IDLE_PCT`` idle. This bench measures where that line belongs: it runs
the reference scenarios (``ecmp-basic --policy hash5 --seed 1 --duration 5`` and
``incast-ecn``) through the real CLI while a load of its own takes a duty cycle ``d`` of
every core (one process pinned per core: busy ``d`` x 10 ms, asleep the rest), started
before the run and killed by PID after it. ``d = 0`` is repeated to measure the run-to-run
noise; a metric has drifted at a load step when every run of that step lies on the same side
beyond ``median +- BAND_FACTOR x (largest deviation of an unloaded run from the median)``.
The threshold proposed is the least idle % (as the lab itself measured it,
``fidelity.cpu_idle_min_pct``) above which no step drifted.

The sweep measures contention, so run it alone: ``flock /tmp/fabriclab-cpu.lock``.

Usage: python bench/fidelity_threshold.py [--steps 0 0.2 0.4 0.6 0.75 0.9] [--baseline 3]
       [--budget-s 780] [--json bench/out/fidelity_threshold.json]
       [--png bench/out/fidelity_threshold.png]
       python bench/fidelity_threshold.py --replot bench/out/fidelity_threshold.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing import Process
from pathlib import Path
from typing import Any

from lab.machine import cpuclass
from lab.measure import headroom

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "out"
FABRICLAB = [sys.executable, "-m", "lab.cli"]
#: Duty cycle period of the load: short enough that every sampler second sees many periods.
PERIOD_S = 0.010
#: A drifted value lies beyond this many times the unloaded runs' largest deviation from their
#: median. With three unloaded runs their range alone would catch half of all further unloaded
#: runs (a fourth sample falls outside the range of three with probability 1/2).
BAND_FACTOR = 2.0
#: The port incast-ecn's bursts meet in (its scenario's ``ecn.ports``).
INCAST_PORT = "leaf1-eth1"
RUN_TIMEOUT_S = 240.0
HIFI_PCT = 35.0             # Mininet-HiFi's reproductions

SCENARIOS: dict[str, list[str]] = {
    "ecmp-basic": ["ecmp-basic", "--policy", "hash5", "--seed", "1", "--duration", "5"],
    "incast-ecn": ["incast-ecn"],
}


# --- the load ------------------------------------------------------------------------------

def _spin(core: int, duty: float) -> None:
    """Busy ``duty`` of every PERIOD_S on one core, asleep for the rest."""
    os.sched_setaffinity(0, {core})
    busy, idle = duty * PERIOD_S, (1 - duty) * PERIOD_S
    while True:
        end = time.perf_counter() + busy
        while time.perf_counter() < end:
            pass
        if idle > 0:
            time.sleep(idle)


class LoadGroup:
    """A CPU group weighed as a run's programs are (``cpuclass.weigh_run_group``), for a
    load that stands for the lab's own programs (a browser, ranks, loaders) rather than for
    another user's: the datapath keeps its priority over it, as in a run."""

    def __init__(self) -> None:
        mech = cpuclass.mechanism()
        if mech.cpu is None:
            raise SystemExit("--class-steps needs a CPU controller")
        self.path = mech.cpu / f"fabriclab-bench-load-{os.getpid()}"
        self.path.mkdir(exist_ok=True)
        self.weight = cpuclass.weigh_run_group(self.path, mech)

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        cpuclass.remove_groups([str(self.path)])


def start_load(duty: float, group: LoadGroup | None = None) -> list[Process]:
    """One spinner per core (none at duty 0), in ``group`` if given; stop them with
    ``stop_load``."""
    if duty <= 0:
        return []
    procs = [Process(target=_spin, args=(core, duty), daemon=True)
             for core in sorted(os.sched_getaffinity(0))]
    for p in procs:
        p.start()
        if group is not None and p.pid is not None:
            group.add(p.pid)
    return procs


def stop_load(procs: list[Process]) -> None:
    for p in procs:
        if p.pid is not None:
            os.kill(p.pid, 9)
        p.join(timeout=5)


# --- one run -------------------------------------------------------------------------------

def ecmp_metrics(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One point: the run's idle and its ecmp headline numbers."""
    mt, fid = result["metrics"], result["fidelity"]
    return [{"x_idle_pct": fid["cpu_idle_min_pct"], "lab_cpu_pct": fid.get("lab_cpu_pct"),
             **datapath(fid),
             "metrics": {"ecmp goodput Mbit/s": mt["aggregate_goodput_bps"] / 1e6,
                         "ecmp uplink drops": float(sum(mt["uplink_drops"].values())),
                         "ecmp imbalance": mt["imbalance"]}}]


def incast_metrics(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One point per phase, at that phase's own least idle second."""
    points = []
    for name, mt in result["metrics"]["phases"].items():
        if "step_p99_s" not in mt:           # a phase this kernel skipped
            continue
        q = mt.get("queues", {}).get(INCAST_PORT, {})
        points.append({
            "phase": name, "x_idle_pct": mt["cpu_idle_min_pct"],
            "lab_cpu_pct": mt.get("lab_cpu_pct"), **datapath(mt),
            "metrics": {f"incast {name} step p99 ms": mt["step_p99_s"] * 1000,
                        f"incast {name} step p50 ms": mt["step_p50_s"] * 1000,
                        f"incast {name} queue delay p99 ms": q.get("delay_ms", {}).get("p99"),
                        f"incast {name} drops": float(mt["drops"])}})
    return points


def datapath(judged: dict[str, Any]) -> dict[str, Any]:
    """A point's datapath numbers: its worst second's run-queue wait and softirq, and the
    classes' CPU (None in a result written before the lab measured them)."""
    return {"x_wait_ms": judged.get("datapath_wait_max_ms"),
            "softirq_max_pct": judged.get("softirq_max_pct"),
            "cpu_classes": judged.get("cpu_classes")}


EXTRACT: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
    "ecmp-basic": ecmp_metrics, "incast-ecn": incast_metrics}


def run_once(scenario: str, duty: float, tag: str,
             group: LoadGroup | None = None) -> dict[str, Any]:
    """One CLI run under the load (in ``group``: at the lab's programs' weight); its points,
    or why there are none."""
    out = OUT / "fidelity" / tag
    (out / "result.json").unlink(missing_ok=True)     # never read an older run's numbers
    load = start_load(duty, group)
    t0 = time.monotonic()
    try:
        proc = subprocess.run([*FABRICLAB, "run", *SCENARIOS[scenario], "--out", str(out)],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=RUN_TIMEOUT_S)
        rc, log = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as e:
        rc, log = -1, f"timeout after {RUN_TIMEOUT_S:.0f} s: {e.stdout!r}"
    finally:
        stop_load(load)
    row: dict[str, Any] = {"scenario": scenario, "duty": duty, "tag": tag,
                           "load": "class" if group is not None and duty > 0 else "root",
                           "wall_s": round(time.monotonic() - t0, 1), "rc": rc}
    (OUT / "fidelity" / f"{tag}.log").write_text(log or "")
    if rc != 0 or not (out / "result.json").exists():
        row["why"] = " | ".join([ln for ln in (log or "").splitlines() if ln.strip()][-3:])
        row["points"] = []
        return row
    result = json.loads((out / "result.json").read_text())
    row["cpu_idle_min_pct"] = result["fidelity"]["cpu_idle_min_pct"]
    row["lab_cpu_pct"] = result["fidelity"].get("lab_cpu_pct")
    row["valid"] = result["fidelity"]["valid"]
    row["points"] = EXTRACT[scenario](result)
    return row


# --- noise and drift (pure) ----------------------------------------------------------------

def noise_band(baseline: list[float], factor: float = BAND_FACTOR) -> tuple[float, float]:
    """(median, half-width) of a metric's unloaded runs: ``factor`` x the largest deviation
    of one of them from their median."""
    m = statistics.median(baseline)
    return m, factor * max(abs(b - m) for b in baseline)


def drift(value: float, median: float) -> float | None:
    """Relative drift from the unloaded median (None when the median is 0)."""
    return (value - median) / abs(median) if median else None


def out_of_band(value: float, median: float, half: float) -> float:
    """+1 above the band, -1 below it, 0 inside."""
    if abs(value - median) <= half + 1e-12:
        return 0
    return 1 if value > median else -1


def step_drifted(sides: list[float]) -> bool:
    """A load step has drifted when every one of its runs, two at least, lies beyond the
    band on the same side: a shift, not one run's noise (with ~15 metrics and a band from
    3 runs, single runs outside it are expected by chance)."""
    return len(sides) >= 2 and sides[0] != 0 and all(x == sides[0] for x in sides)


def threshold(points: list[tuple[float, bool]]) -> float:
    """The least-idle % above which no run drifted: the most idle run of a drifted step
    (0 if none drifted). ``points``: (measured idle %, its step drifted)."""
    drifted = [x for x, d in points if d]
    return max(drifted, default=0.0)


def analyse(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric: its band from the duty-0 runs, every point's drift, which load steps
    drifted; and the threshold over all metrics."""
    series: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        for pt in row["points"]:
            for name, v in pt["metrics"].items():
                if v is not None:
                    series.setdefault(name, []).append(
                        {"duty": row["duty"], "load": row.get("load", "root"),
                         "x": pt["x_idle_pct"], "wait": pt.get("x_wait_ms"), "value": v,
                         "tag": row["tag"]})
    out: dict[str, Any] = {}
    verdicts: list[tuple[float, bool]] = []
    waits: list[tuple[float, bool]] = []
    for name, pts in series.items():
        base = [p["value"] for p in pts if p["duty"] == 0]
        if len(base) < 2:
            continue
        med, half = noise_band(base)
        steps: dict[tuple[float, str], list[dict[str, Any]]] = {}
        for p in pts:
            p["drift"] = drift(p["value"], med)
            p["side"] = out_of_band(p["value"], med, half)
            p["out"] = p["side"] != 0
            steps.setdefault((p["duty"], p["load"]), []).append(p)
        drifted = sorted(k for k, ps in steps.items()
                         if k[0] > 0 and step_drifted([p["side"] for p in ps]))
        for k, ps in steps.items():
            verdicts += [(p["x"], k in drifted) for p in ps]
            waits += [(p["wait"], k in drifted) for p in ps if p["wait"] is not None]
        out[name] = {"median": med, "half_width": half,
                     "band_rel": half / abs(med) if med else None,
                     "drifted_steps": [d for d, _ in drifted],
                     "drifted": [list(k) for k in drifted], "points": pts}
    return {"metrics": out, "threshold_pct": threshold(verdicts),
            "wait_threshold_ms": wait_threshold(waits), "verdicts": verdicts,
            "wait_verdicts": waits}


def wait_threshold(points: list[tuple[float, bool]]) -> float | None:
    """The datapath wait (ms per second, worst second) below which no run drifted: the
    least waiting run of a drifted step (None if none drifted)."""
    drifted = [w for w, d in points if d]
    return min(drifted) if drifted else None


def misjudged(points: list[tuple[float, bool]], ok: Callable[[float], bool]) -> tuple[int, int]:
    """(drifted runs a rule calls valid, undrifted runs it calls invalid) of (x, drifted)."""
    return (sum(1 for x, d in points if d and ok(x)),
            sum(1 for x, d in points if not d and not ok(x)))


# --- report --------------------------------------------------------------------------------

def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one line per run and phase."""
    head = ("load d", "scenario (phase)", "CPU idle min %", "lab CPU %", "metrics")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        if not row["points"]:
            lines.append(f"| {row['duty']:g} | {row['scenario']} | - | - | failed: "
                         f"{row.get('why', '')} |")
        for pt in row["points"]:
            ms = ", ".join(f"{k.split(' ', 2 if 'phase' in pt else 1)[-1]} {v:.3g}"
                           for k, v in pt["metrics"].items() if v is not None)
            scen = row["scenario"] + (f" ({pt['phase']})" if "phase" in pt else "")
            lab = "-" if pt["lab_cpu_pct"] is None else f"{pt['lab_cpu_pct']:.0f}"
            lines.append(f"| {row['duty']:g} | {scen} | {pt['x_idle_pct']:.0f} | {lab} | {ms} |")
    return "\n".join(lines)


def plot(analysis: dict[str, Any], png: Path, x: str = "x") -> None:
    """Drift per metric against the least idle second (``x="x"``) or against the datapath's
    worst second of waiting (``x="wait"``), noise band shaded, the lines marked; a load at
    the lab's programs' weight drawn as squares."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(analysis["metrics"])
    cols = 4
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    thr = analysis["threshold_pct"]
    for ax, name in zip(axes.flat, names, strict=False):
        m = analysis["metrics"][name]
        med, half = m["median"], m["half_width"]
        scale = abs(med) if med else 1.0
        unit = "%" if med else "abs"
        k = 100.0 if med else 1.0
        ax.axhspan(-half / scale * k, half / scale * k, color="0.85", label="noise band")
        for p in m["points"]:
            if p.get(x) is None:
                continue
            y = (p["value"] - med) / scale * k
            ax.plot(p[x], y, "s" if p.get("load") == "class" else "o",
                    color="tab:red" if p["out"] else "tab:blue", ms=4)
        if x == "wait":
            ax.axvline(headroom.MAX_DATAPATH_WAIT_MS, color="tab:red", lw=1,
                       label=f"line {headroom.MAX_DATAPATH_WAIT_MS:g} ms/s")
            ax.set_xlabel("datapath's worst second of run-queue wait, ms/s", fontsize=8)
        else:
            ax.axvline(thr, color="tab:red", lw=1, label=f"threshold {thr:.0f} %")
            ax.axvline(headroom.MIN_CPU_IDLE_PCT, color="k", lw=0.8, ls=":",
                       label=f"{headroom.MIN_CPU_IDLE_PCT:g} % (idle line)")
            ax.axvline(HIFI_PCT, color="tab:green", lw=0.8, ls="--", label="35 % (HiFi)")
            ax.set_xlabel("least idle CPU second, % (lab-measured)", fontsize=8)
        ax.set_title(name, fontsize=9)
        ax.set_ylabel(f"drift vs unloaded median ({unit})", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=90)


def summary(analysis: dict[str, Any]) -> str:
    lines = []
    for name, m in analysis["metrics"].items():
        band = (f"±{m['band_rel'] * 100:.1f} %" if m["band_rel"] is not None
                else f"±{m['half_width']:.3g}")
        steps = []
        for d in m["drifted_steps"]:
            ps = [p for p in m["points"] if p["duty"] == d]
            rel = [p["drift"] * 100 for p in ps if p["drift"] is not None]
            steps.append(f"d={d:g} (idle {min(p['x'] for p in ps):.0f}-"
                         f"{max(p['x'] for p in ps):.0f} %"
                         + (f", {min(rel):+.1f}..{max(rel):+.1f} %" if rel else "") + ")")
        lines.append(f"{name}: median {m['median']:.4g}, band {band}; drifted at "
                     + (", ".join(steps) or "no step"))
    lines.append(f"threshold: no metric drifted above {analysis['threshold_pct']:.0f} % least "
                 "idle")
    wt = analysis.get("wait_threshold_ms")
    lines.append("datapath wait: " + ("no step drifted" if wt is None else
                 f"no metric drifted below {wt:.0f} ms/s of the datapath's run-queue wait"))
    idle_bad = misjudged(analysis["verdicts"], lambda x: x >= headroom.MIN_CPU_IDLE_PCT)
    wait_bad = misjudged(analysis["wait_verdicts"],
                         lambda w: w <= headroom.MAX_DATAPATH_WAIT_MS)
    lines.append(f"idle line {headroom.MIN_CPU_IDLE_PCT:g} %: {idle_bad[0]} drifted points "
                 f"valid, {idle_bad[1]} undrifted invalid (of {len(analysis['verdicts'])})")
    lines.append(f"wait line {headroom.MAX_DATAPATH_WAIT_MS:g} ms/s: {wait_bad[0]} drifted "
                 f"points valid, {wait_bad[1]} undrifted invalid "
                 f"(of {len(analysis['wait_verdicts'])})")
    return "\n".join(lines)


def order(steps: list[float], baseline: int) -> list[float]:
    """Unloaded runs spread over the sweep (first, middle, last), so slow drift of the machine
    itself shows up in the noise band, not as load."""
    loaded = [d for d in steps if d > 0]
    seq: list[float] = [0.0]
    extra = baseline - 1
    half = len(loaded) // 2
    seq += loaded[:half]
    if extra > 1:
        seq.append(0.0)
        extra -= 1
    seq += loaded[half:]
    seq += [0.0] * extra
    return seq


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=float, nargs="+", default=[0, 0.2, 0.4, 0.6, 0.75, 0.9])
    ap.add_argument("--baseline", type=int, default=3, help="unloaded runs (noise band)")
    ap.add_argument("--budget-s", type=float, default=780.0,
                    help="after one pass, repeat loaded steps until this much wall has gone")
    ap.add_argument("--class-steps", type=float, nargs="*", default=[],
                    help="loaded steps run again with the load at the lab's programs' weight")
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    ap.add_argument("--json", default=str(OUT / "fidelity_threshold.json"))
    ap.add_argument("--png", default=str(OUT / "fidelity_threshold.png"))
    ap.add_argument("--replot", help="re-analyse and plot a JSON this bench wrote")
    args = ap.parse_args()
    if any(not 0 <= d < 1 for d in args.steps):
        print("--steps: each duty cycle must be in [0, 1)", file=sys.stderr)
        return 2
    if args.baseline < 2:
        print("--baseline: at least 2 unloaded runs make a noise band", file=sys.stderr)
        return 2
    group = LoadGroup() if args.class_steps and not args.replot else None
    if args.replot:
        rows = json.loads(Path(args.replot).read_text())["rows"]
    else:
        (OUT / "fidelity").mkdir(parents=True, exist_ok=True)
        rows, t0 = [], time.monotonic()
        seq = order(args.steps, args.baseline)
        passes = 0
        while True:
            for i, duty in enumerate(seq):
                if passes and time.monotonic() - t0 > args.budget_s:
                    break
                for scen in args.scenarios:
                    tag = f"{scen}-d{duty:g}-p{passes}-{i}"
                    row = run_once(scen, duty, tag)
                    rows.append(row)
                    print(f"{tag}: rc {row['rc']} wall {row['wall_s']} s, idle min "
                          f"{row.get('cpu_idle_min_pct')} %, lab {row.get('lab_cpu_pct')} %,"
                          f" valid {row.get('valid')} {row.get('why', '')}", flush=True)
                    if duty not in args.class_steps:
                        continue
                    tag = f"{scen}-c{duty:g}-p{passes}-{i}"
                    row = run_once(scen, duty, tag, group)
                    rows.append(row)
                    print(f"{tag}: rc {row['rc']} wall {row['wall_s']} s, idle min "
                          f"{row.get('cpu_idle_min_pct')} %, lab {row.get('lab_cpu_pct')} %,"
                          f" valid {row.get('valid')} {row.get('why', '')}", flush=True)
            passes += 1
            seq = [d for d in args.steps if d > 0]
            if time.monotonic() - t0 > args.budget_s:
                break
    if group is not None:
        group.remove()
    analysis = analyse(rows)
    Path(args.json).write_text(json.dumps({
        "scenarios": SCENARIOS, "period_s": PERIOD_S, "band_factor": BAND_FACTOR,
        "cores": len(os.sched_getaffinity(0)), "rows": rows, "analysis": analysis},
        indent=1))
    plot(analysis, Path(args.png))
    plot(analysis, Path(args.png).with_name(Path(args.png).stem + "_wait.png"), x="wait")
    print(table(rows))
    print(summary(analysis))
    return 0


if __name__ == "__main__":
    sys.exit(main())
