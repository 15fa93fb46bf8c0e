"""How many processes the lab itself spawns while traffic runs, and which.

Under software emulation (a QEMU TCG guest) starting a process costs ~10x what it costs
here (exec plus code translation), so a helper spawned per sample can eat the CPU headroom
a run's fidelity check asks for. This runs one ``fabriclab run`` under
``strace -f --seccomp-bpf -e trace=execve`` (only exec stops, so the run's timing barely
changes), then counts the successful execs inside each traffic phase: from the first
traffic generator's start (iperf3 client, collective worker, stream sender or player) to
the last one's exit, phases split where generators are more than ``GAP_S`` apart.

    bench/lab_overhead.py -- ecmp-basic --policy hash5 --seed 1
    bench/lab_overhead.py -- streaming-incident --set phases=before-upgrade,incident

Prints, per phase, spawns per second and per program (traffic generators themselves and
their ``mnexec`` wrappers are listed apart), and the run's fidelity numbers from
result.json. The numbers are the machine's of the moment: on 2 shared cores, repeat.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

GAP_S = 1.0
LINE = re.compile(r"^(\d+)\s+(\d+\.\d+)\s+(.*)$")
EXEC = re.compile(r'execve\("([^"]*)", \[(.*?)\]')
RESULT = re.compile(r"\)\s+=\s+(-?\d+)")
GENERATOR = (re.compile(r'"iperf3", .*"-c"'), re.compile(r'"lab\.collective"'),
             re.compile(r'"lab\.streamtool"'))


@dataclass
class Exec:
    pid: int
    t: float
    prog: str
    argv: str
    generator: bool
    exited: float | None = None


@dataclass
class Phase:
    start: float
    end: float
    spawns: collections.Counter[str] = field(default_factory=collections.Counter)
    traffic: int = 0


def parse(path: Path) -> list[Exec]:
    """Successful execs, in order, with the time their process exited (if it did)."""
    pending: dict[int, tuple[float, str, str]] = {}
    execs: list[Exec] = []
    last_exec: dict[int, Exec] = {}
    for raw in path.read_text(errors="replace").splitlines():
        m = LINE.match(raw)
        if not m:
            continue
        pid, t, rest = int(m.group(1)), float(m.group(2)), m.group(3)
        if rest.startswith("+++"):
            if pid in last_exec:
                last_exec[pid].exited = t
            continue
        e = EXEC.search(rest)
        if e:
            if rest.endswith("<unfinished ...>"):
                pending[pid] = (t, e.group(1), e.group(2))
                continue
            call = (t, e.group(1), e.group(2))
        elif "execve resumed" in rest and pid in pending:
            call = pending.pop(pid)
        else:
            continue
        r = RESULT.search(rest)
        if r and r.group(1) == "0":
            argv = call[2]
            ex = Exec(pid, call[0], call[1].rsplit("/", 1)[-1], argv,
                      any(g.search(argv) for g in GENERATOR))
            execs.append(ex)
            last_exec[pid] = ex
    return execs


def phases(execs: list[Exec]) -> list[Phase]:
    """Traffic phases: clusters of generator lifetimes, with every exec inside counted."""
    gens = [e for e in execs if e.generator]
    out: list[Phase] = []
    for g in gens:
        end = g.exited or g.t
        if out and g.t - out[-1].end <= GAP_S:
            out[-1].end = max(out[-1].end, end)
        else:
            out.append(Phase(g.t, end))
    for ph in out:
        for e in execs:
            if ph.start <= e.t <= ph.end:
                if e.generator or (e.prog == "mnexec" and any(
                        g.search(e.argv) for g in GENERATOR)):
                    ph.traffic += 1
                else:
                    ph.spawns[e.prog] += 1
    return out


def trace(run_args: list[str], work: Path) -> int:
    """``fabriclab run`` under strace, its exec log in ``work``; returns its exit code."""
    work.mkdir(parents=True, exist_ok=True)
    log = work / "exec.strace"
    cmd = ["strace", "-f", "--seccomp-bpf", "-q", "-ttt", "-s", "256", "-e", "trace=execve",
           "-e", "signal=none", "-o", str(log), "fabriclab", "run", *run_args,
           "--out", str(work / "run")]
    rc = subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode
    if rc != 0:
        print(f"fabriclab run exited {rc}; log in {log}", file=sys.stderr)
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, help="keep the strace log and result here")
    ap.add_argument("--parse", type=Path, help="count an earlier --keep folder's log again")
    ap.add_argument("run_args", nargs=argparse.REMAINDER,
                    help="arguments of `fabriclab run` (after --)")
    args = ap.parse_args()
    run_args = [a for a in args.run_args if a != "--"]
    rc = 0
    if args.parse:
        work = args.parse
    else:
        work = args.keep or Path(tempfile.mkdtemp(prefix="lab-overhead-"))
        rc = trace(run_args, work)
    execs = parse(work / "exec.strace")
    for i, ph in enumerate(phases(execs)):
        span = max(ph.end - ph.start, 1e-3)
        n = sum(ph.spawns.values())
        print(f"phase {i}: {span:.1f} s, {ph.traffic} traffic execs, lab spawns {n} "
              f"({n / span:.2f}/s): " + ", ".join(f"{p} {c}" for p, c in
                                                  ph.spawns.most_common()))
    for res in sorted((work / "run").rglob("result.json")):
        fid = json.loads(res.read_text())["fidelity"]
        print(f"{res.parent.relative_to(work)} fidelity:",
              {k: fid.get(k) for k in ("valid", "cpu_idle_min_pct", "cpu_idle_pct",
                                       "lab_cpu_pct")})
    return rc


if __name__ == "__main__":
    sys.exit(main())
