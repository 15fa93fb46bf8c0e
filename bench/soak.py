"""Soak: many `fabriclab run ecmp-basic --policy hash5` in a row; does anything accumulate?

One run that cleans up is not a lab that can run all night: a leak of one interface, one
namespace, one file descriptor in ovs-vswitchd or a few KiB in the state folder per run
only shows after many runs. Before the first run and after every run this measures, with
the lab lock held (so no other run on a shared machine is in progress):

- the lab's leftovers (interfaces, OVS bridges, processes with the run marker, records);
- network namespaces (distinct ``/proc/*/ns/net``) and the number of processes;
- open file descriptors of ovs-vswitchd and ovsdb-server, the long-lived daemons a leak
  would accumulate in (every run adds and deletes bridges, ports and OpenFlow connections);
- disk used by the state folder and by the results written so far;

and, while each run runs, the controller's VmRSS every 0.5 s (its peak per run).
A leftover, a failed run, or growth beyond a small bound from the first sample to the last
is a failure (exit 1).

Usage: python bench/soak.py [--runs 30] [--duration 3] [--json bench/out/soak.json]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from lab.machine import state  # noqa: E402
from tests.integration.support import lab_leftovers, lab_turn, record_of  # noqa: E402

FABRICLAB = [sys.executable, "-m", "lab.cli"]
OVS_RUN_DIR = Path("/var/run/openvswitch")
DAEMONS = ("ovs-vswitchd", "ovsdb-server")
RSS_EVERY_S = 0.5
#: Growth above the first sample that is still noise, per measure. The daemons' descriptors
#: do not move at all between runs when nothing leaks, so a leak of one per run exceeds
#: their bound within three runs. Namespaces get a little slack: other people's jobs on a
#: shared machine (a browser in a namespace, a colleague's test) come and go, and a lab
#: namespace that stays also leaves its marked shell, which the leftovers catch. Processes
#: are shown but not judged: other jobs move them by hundreds.
BOUNDS = {"netns": 2, "ovs-vswitchd fds": 2, "ovsdb-server fds": 2,
          "state dir KiB": 64}


# -- measures ----------------------------------------------------------------------------------
def netns_count() -> int:
    """Distinct network namespaces that have a process in them."""
    seen = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):      # gone meanwhile
                seen.add(os.readlink(entry / "ns" / "net"))
    return len(seen)


def process_count() -> int:
    return sum(1 for e in Path("/proc").iterdir() if e.name.isdigit())


def daemon_pid(name: str) -> int | None:
    try:
        return int((OVS_RUN_DIR / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None


def open_fds(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def disk_kib(path: Path) -> int:
    """Disk used by the files under ``path`` (allocated blocks, as ``du``)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
    return total // 1024


@dataclass
class Sample:
    """The machine between runs."""

    leftovers: dict[str, list] = field(default_factory=dict)
    netns: int = 0
    processes: int = 0
    fds: dict[str, int | None] = field(default_factory=dict)
    state_kib: int = 0
    results_kib: int = 0

    def measures(self) -> dict[str, int | None]:
        return {"netns": self.netns, "processes": self.processes,
                **{f"{d} fds": self.fds.get(d) for d in DAEMONS},
                "state dir KiB": self.state_kib, "results KiB": self.results_kib}


def measure(results: Path) -> Sample:
    """Everything at once, with the lab lock held: no run is in progress meanwhile."""
    with lab_turn():
        return Sample(leftovers=lab_leftovers(), netns=netns_count(),
                      processes=process_count(),
                      fds={d: open_fds(daemon_pid(d)) for d in DAEMONS},
                      state_kib=disk_kib(state.STATE_DIR), results_kib=disk_kib(results))


def controller_rss_kib(owner_pid: int) -> int | None:
    """VmRSS of the controller of the run started by ``owner_pid`` (from its record)."""
    rec = record_of(owner_pid)
    if rec is None:
        return None
    for p in rec.pids:
        if p.get("what") == "controller":
            try:
                status = Path(f"/proc/{p['pid']}/status").read_text()
            except OSError:
                return None
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    return None


# -- runs ---------------------------------------------------------------------------------------
@dataclass
class RunStat:
    rc: int
    wall_s: float
    #: From result.json: the run's wall time (waiting for the lab lock included), its
    #: bring-up and its teardown; a run slowing down over a soak is a leak's symptom too.
    run_wall_s: float | None
    ready_s: float | None
    stop_s: float | None
    rss_peak_kib: int | None
    rss_samples: int


def run_once(out: Path, duration: float) -> RunStat:
    """One `fabriclab run`, sampling its controller's memory while it runs."""
    t0 = time.monotonic()
    proc = subprocess.Popen([*FABRICLAB, "run", "ecmp-basic", "--policy", "hash5",
                             "--duration", f"{duration:g}", "--out", str(out)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak, samples = None, 0
    while proc.poll() is None:
        rss = controller_rss_kib(proc.pid)
        if rss is not None:
            peak, samples = max(peak or 0, rss), samples + 1
        time.sleep(RSS_EVERY_S)
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode != 0:
        print(f"run failed ({proc.returncode}): {err.strip()[-500:]}", flush=True)
    try:
        timings = json.loads((out / "result.json").read_text())["timings"]
    except (OSError, ValueError, KeyError):
        timings = {}
    return RunStat(proc.returncode, round(time.monotonic() - t0, 2), timings.get("wall_s"),
                   timings.get("ready_s"), timings.get("stop_s"), peak, samples)


# -- verdict --------------------------------------------------------------------------------------
def leftovers_in(samples: list[Sample]) -> list[str]:
    return [f"sample {i}: {s.leftovers}" for i, s in enumerate(samples)
            if any(s.leftovers.values())]


def growth(samples: list[Sample]) -> dict[str, dict[str, object]]:
    """Per measure: first, last, min, max, growth, monotonic (never went down)."""
    rows: dict[str, dict[str, object]] = {}
    for key in samples[0].measures():
        vals = [s.measures()[key] for s in samples]
        if any(v is None for v in vals):
            rows[key] = {"values": vals, "growth": None}
            continue
        nums = [int(v) for v in vals]  # type: ignore[arg-type]
        rows[key] = {"first": nums[0], "last": nums[-1], "min": min(nums), "max": max(nums),
                     "growth": nums[-1] - nums[0],
                     "monotonic": all(b >= a for a, b in itertools.pairwise(nums)),
                     "bound": BOUNDS.get(key)}
    return rows


def leaks_in(samples: list[Sample], rows: dict[str, dict[str, object]]) -> list[str]:
    """Measures beyond their bound above the first sample in the last two samples (a leak
    stays; a colleague's passing job does not), or gone missing."""
    found = []
    for key, bound in BOUNDS.items():
        row = rows[key]
        if row["growth"] is None:
            found.append(f"{key}: not measurable ({row['values']})")
            continue
        tail = [int(s.measures()[key]) for s in samples[-2:]]  # type: ignore[arg-type]
        if min(tail) - int(row["first"]) > bound:  # type: ignore[call-overload]
            found.append(f"{key} grew {row['first']} -> {row['last']} (bound +{bound})")
    return found


# -- the soak -------------------------------------------------------------------------------------
def soak(runs: int, duration: float, results: Path, log=print) -> dict[str, object]:
    """``runs`` runs in a row with a sample before the first and after each; the verdict."""
    t0 = time.monotonic()
    samples = [measure(results)]
    stats: list[RunStat] = []
    for i in range(1, runs + 1):
        stats.append(run_once(results / f"run{i:02d}", duration))
        samples.append(measure(results))
        st, s = stats[-1], samples[-1]
        rss = f"{st.rss_peak_kib / 1024:.1f} MiB" if st.rss_peak_kib else "n/a"
        log(f"run {i:2d}/{runs}: rc {st.rc}, {st.wall_s:5.1f} s wall, up {st.ready_s} s, "
            f"down {st.stop_s} s, "
            f"controller peak RSS {rss}; leftovers "
            f"{sum(len(v) for v in s.leftovers.values())}, netns {s.netns}, "
            f"processes {s.processes}, fds vswitchd {s.fds['ovs-vswitchd']} / ovsdb "
            f"{s.fds['ovsdb-server']}, state dir {s.state_kib} KiB, results "
            f"{s.results_kib} KiB")
    rows = growth(samples)
    peaks = [s.rss_peak_kib for s in stats if s.rss_peak_kib]
    return {
        "runs": runs, "duration_s": duration, "total_s": round(time.monotonic() - t0, 1),
        "failed_runs": [i + 1 for i, s in enumerate(stats) if s.rc != 0],
        "leftovers": leftovers_in(samples), "leaks": leaks_in(samples, rows), "measures": rows,
        "controller_rss_peak_kib": {"first": peaks[0] if peaks else None,
                                    "last": peaks[-1] if peaks else None,
                                    "min": min(peaks, default=None),
                                    "median": statistics.median(peaks) if peaks else None,
                                    "max": max(peaks, default=None)},
        **{f"{k}_s": spread([getattr(s, f"{k}_s") for s in stats])
           for k in ("wall", "ready", "stop")},
        "per_run": [asdict(s) for s in stats],
        "samples": [{**s.measures(), "leftovers": {k: len(v) for k, v in s.leftovers.items()}}
                    for s in samples],
    }


def spread(values: list[float | None]) -> dict[str, float | None]:
    """First, median, max and last of a per-run timing (None where a run had none)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return {"first": None, "median": None, "max": None, "last": None}
    return {"first": vals[0], "median": statistics.median(vals), "max": max(vals),
            "last": vals[-1]}


def ok(report: dict[str, object]) -> bool:
    return not (report["failed_runs"] or report["leftovers"] or report["leaks"])


def print_table(report: dict[str, object]) -> None:
    rows = report["measures"]
    assert isinstance(rows, dict)
    print(f"\n{'measure':18s} {'before':>8s} {'after last':>10s} {'min':>8s} {'max':>8s} "
          f"{'growth':>7s} {'bound':>6s}  monotonic")
    for key, r in rows.items():
        if r["growth"] is None:
            print(f"{key:18s} not measurable: {r['values']}")
            continue
        bound = "-" if r["bound"] is None else f"+{r['bound']}"
        print(f"{key:18s} {r['first']:>8} {r['last']:>10} {r['min']:>8} {r['max']:>8} "
              f"{r['growth']:>+7} {bound:>6s}  {'yes' if r['monotonic'] else 'no'}")
    rss = report["controller_rss_peak_kib"]
    assert isinstance(rss, dict)
    if rss["min"]:
        print(f"controller peak RSS per run: first {rss['first'] / 1024:.1f}, median "
              f"{rss['median'] / 1024:.1f}, max {rss['max'] / 1024:.1f}, last "
              f"{rss['last'] / 1024:.1f} MiB")
    for k in ("ready", "stop"):
        t = report[f"{k}_s"]
        assert isinstance(t, dict)
        if t["median"] is not None:
            print(f"{'bring-up' if k == 'ready' else 'teardown'} per run: first {t['first']:.2f}, "
                  f"median {t['median']:.2f}, max {t['max']:.2f}, last {t['last']:.2f} s")
    print(f"runs {report['runs']} x {report['duration_s']} s traffic in {report['total_s']} s; "
          f"failed runs {report['failed_runs'] or 'none'}; leftovers "
          f"{report['leftovers'] or 'none'}; leaks {report['leaks'] or 'none'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--duration", type=float, default=3.0, help="traffic seconds per run")
    ap.add_argument("--json", default=str(REPO / "bench" / "out" / "soak.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fabriclab-soak-") as tmp:
        report = soak(args.runs, args.duration, Path(tmp), log=lambda m: print(m, flush=True))
    print_table(report)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if ok(report) else 1


if __name__ == "__main__":
    sys.exit(main())
