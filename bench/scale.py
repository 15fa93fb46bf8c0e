"""How large a fat-tree this machine emulates with ``fidelity`` still valid (k = 4, 6, 8).

Each size is one real ``fabriclab run ecmp-polarisation --policy hash5`` through the CLI,
so the numbers include everything a user pays for: bring-up, the all-pairs ping, traffic,
telemetry and teardown. The flow count grows with the fabric (one flow per host, capped at
the scenario's limit) while link rates and the offered load stay the scenario's, so what
grows is the emulator's work per second - ports polled, namespaces, iperf3 processes,
packet-ins - not the bandwidth asked of the one ``ovs-vswitchd``.

A size that cannot come up (timeout, memory, refused by the topology module) becomes a row
that says why, not a failed benchmark: "k=8 does not fit" is itself the answer sought.

Its verdicts are the budgets of ``fabriclab run``'s expected fidelity: the runs are listed,
with their numbers, in ``lab/model/capacity.py`` (``MEASURED``); a new measurement goes there.

Usage: FABRICLAB_LOCK_WAIT=2400 python bench/scale.py [--k 4 6 8] [--duration 4]
       [--timeout 900] [--flows F] [--policy hash5] [--json bench/out/scale.json]
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "out"
FABRICLAB = [sys.executable, "-m", "lab.cli"]
SCENARIO = "ecmp-polarisation"
#: ``traffic.flows`` is capped here by the ecmp kind's schema (lab/kinds/ecmp/__init__.py).
MAX_FLOWS = 128
#: The line ``lab.kinds.base.bring_up`` prints once the lab lock is held: the time before it is
#: waiting for other engineers' runs, not this fabric's cost.
STARTED_MARK = "bringing up"
#: The policy measured: the controller installs every flow on packet-in, so it is the one
#: whose controller work grows with the fabric. ``ovs-select`` (the switch hashes by itself)
#: is the comparison that tells the controller's share from the datapath's.
DEFAULT_POLICY = "hash5"


@dataclass
class Row:
    """One fabric size: what the run's result.json says, or why there is none."""

    k: int
    switches: int
    hosts: int
    flows: int
    status: str = "ok"
    why: str = ""
    ready_s: float | None = None
    stop_s: float | None = None
    pingall_loss_pct: float | None = None
    cpu_idle_min_pct: float | None = None
    fidelity_valid: bool | None = None
    fidelity_notes: list[str] = field(default_factory=list)
    rate_scale: float = 1.0
    link_mbps: float | None = None
    lab_cpu_pct: float | None = None
    goodput_mbps: float | None = None
    offered_mbps: float | None = None
    run_wall_s: float | None = None
    lock_wait_s: float | None = None
    loadavg_before: str = ""
    loadavg_after: str = ""
    out_dir: str = ""


def fat_tree_size(k: int) -> tuple[int, int]:
    """(switches, hosts) of a k-ary fat-tree: 5k^2/4 switches, k^3/4 hosts."""
    return 5 * k * k // 4, k ** 3 // 4


def loadavg() -> str:
    """The 1/5/15-minute load: other engineers' runs lower CPU idle, so each row keeps it."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def command(k: int, flows: int, duration: float, out: Path, policy: str,
            rate_scale: float = 1.0) -> list[str]:
    return [*FABRICLAB, "run", SCENARIO, "--policy", policy, "--set", f"topology.k={k}",
            "--set", f"traffic.flows={flows}", "--set", f"rate_scale={rate_scale:g}",
            "--duration", f"{duration:g}", "--out", str(out)]


def run_case(k: int, duration: float, timeout_s: float, fixed_flows: int | None,
             policy: str, rate_scale: float = 1.0) -> Row:
    """One size through the real CLI; stdout is kept in bench/out/<tag>.log."""
    switches, hosts = fat_tree_size(k)
    flows = min(fixed_flows or hosts, MAX_FLOWS)
    tag = (f"scale-k{k}" + (f"-f{fixed_flows}" if fixed_flows else "")
           + ("" if policy == DEFAULT_POLICY else f"-{policy}")
           + ("" if rate_scale == 1.0 else f"-r{rate_scale:g}"))
    out = OUT / tag
    row = Row(k=k, switches=switches, hosts=hosts, flows=flows, out_dir=str(out),
              loadavg_before=loadavg(), rate_scale=rate_scale)
    (out / "result.json").unlink(missing_ok=True)    # never report an older run's numbers
    log_path = OUT / f"{tag}.log"
    t0 = time.monotonic()
    with log_path.open("w") as log:
        # Own session so the CLI's progress ticker cannot touch our terminal; SIGTERM goes to
        # the CLI alone, whose teardown removes everything the run created.
        proc = subprocess.Popen(command(k, flows, duration, out, policy, rate_scale),
                                cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        lock_wait = float(os.environ.get("FABRICLAB_LOCK_WAIT", "0") or 0)
        timed_out, started = _pump(proc, log, t0 + lock_wait + timeout_s, timeout_s)
    end = time.monotonic()
    started = end if started is None else started
    row.lock_wait_s = round(started - t0, 1)
    row.run_wall_s = round(end - started, 1)
    row.loadavg_after = loadavg()
    if timed_out:
        row.status, row.why = "timeout", (f"no result within {timeout_s:.0f} s after the lock "
                                          "wait; the CLI was stopped with SIGTERM")
        return row
    if proc.returncode != 0 or not (out / "result.json").exists():
        tail = [ln for ln in log_path.read_text().splitlines() if ln.strip()][-3:]
        row.status, row.why = "failed", f"exit {proc.returncode}: " + " | ".join(tail)
        return row
    _fill(row, json.loads((out / "result.json").read_text()))
    return row


def _pump(proc: subprocess.Popen, log: IO[str], deadline: float,
          timeout_s: float) -> tuple[bool, float | None]:
    """Copy the CLI's output to the log; (timed out, when the lab lock was taken).

    Until the lock is taken the deadline allows the whole lock wait; from then on, the run
    has ``timeout_s``.
    Reading line by line (not ``communicate``) is what lets the bench tell lock waiting from
    the fabric's own time, and stop a run that would otherwise hold the machine forever.
    """
    assert proc.stdout is not None
    started: float | None = None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    while True:
        if time.monotonic() > deadline:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return True, started
        if sel.select(timeout=1.0):
            line = proc.stdout.readline()
            if not line:
                proc.wait()
                return False, started
            if started is None and STARTED_MARK in line:
                started = time.monotonic()
                deadline = started + timeout_s
            log.write(line)
            log.flush()
        elif proc.poll() is not None:
            return False, started


def _fill(row: Row, result: dict[str, Any]) -> None:
    """The table's columns, straight from result.json (schema 1)."""
    fid, metrics, timings = result["fidelity"], result["metrics"], result["timings"]
    row.ready_s = timings.get("ready_s")
    row.stop_s = timings.get("stop_s")
    row.pingall_loss_pct = metrics.get("pingall_loss_pct")
    row.cpu_idle_min_pct = fid["cpu_idle_min_pct"]
    row.lab_cpu_pct = fid.get("lab_cpu_pct")
    row.link_mbps = result["topology"]["params"].get("fabric_bw")
    row.fidelity_valid = fid["valid"]
    row.fidelity_notes = list(fid["notes"])
    row.goodput_mbps = round(sum(f["goodput_bps"] for f in result["flows"]) / 1e6, 1)
    row.offered_mbps = round(sum(f["offered_bps"] for f in result["flows"]) / 1e6, 1)
    if row.switches != len(result["topology"]["switches"]) or \
            row.hosts != len(result["topology"]["hosts"]):
        row.why = "topology in result.json differs from the k-ary fat-tree formula"


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[Row]) -> str:
    """Markdown, as it goes into docs/scale.md."""
    head = ("k", "switches", "hosts", "flows", "link Mbit/s", "bring-up s", "pingall loss %",
            "CPU idle min %", "lab CPU % of a core", "fidelity", "goodput / offered Mbit/s",
            "run wall s")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.status != "ok":
            verdict = f"no result ({r.status}: {r.why})"
        else:
            verdict = "valid" if r.fidelity_valid else "INVALID"
        good = ("-" if r.goodput_mbps is None
                else f"{r.goodput_mbps:.1f} / {r.offered_mbps:.1f}")
        lines.append("| " + " | ".join([
            str(r.k), str(r.switches), str(r.hosts), str(r.flows), _fmt(r.link_mbps, "g"),
            _fmt(r.ready_s, ".1f"), _fmt(r.pingall_loss_pct, ".1f"),
            _fmt(r.cpu_idle_min_pct, ".0f"), _fmt(r.lab_cpu_pct, ".0f"), verdict, good,
            _fmt(r.run_wall_s, ".1f")]) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, nargs="+", default=[4, 6, 8],
                    help="fat-tree sizes, smallest first (the largest is the riskiest)")
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--timeout", type=float, default=900.0,
                    help="seconds one run may take once it holds the lab lock")
    ap.add_argument("--flows", type=int,
                    help="a fixed flow count for every size (default: one per host), to "
                         "tell the fabric's own cost from the traffic's")
    ap.add_argument("--policy", default=DEFAULT_POLICY)
    ap.add_argument("--rate-scale", type=float, default=1.0,
                    help="every rate x R (the lab's rate_scale): the link rate a size needs "
                         "to stay valid on this machine's one datapath core")
    ap.add_argument("--json", help="default bench/out/scale[-flowsF][-POLICY].json")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for k in sorted(args.k):
        row = run_case(k, args.duration, args.timeout, args.flows, args.policy,
                       args.rate_scale)
        rows.append(row)
        print(f"k={k}: {row.status} {row.why} ready {row.ready_s} s, idle min "
              f"{row.cpu_idle_min_pct}%, valid {row.fidelity_valid}, wall {row.run_wall_s} s "
              f"(lock wait {row.lock_wait_s} s, load {row.loadavg_before} -> "
              f"{row.loadavg_after})", flush=True)
    default = ("scale" + (f"-flows{args.flows}" if args.flows else "")
               + ("" if args.policy == DEFAULT_POLICY else f"-{args.policy}")
               + ("" if args.rate_scale == 1.0 else f"-r{args.rate_scale:g}") + ".json")
    Path(args.json or OUT / default).write_text(json.dumps({
        "scenario": SCENARIO, "policy": args.policy, "duration_s": args.duration,
        "rate_scale": args.rate_scale,
        "flows": args.flows or "one per host",
        "rows": [asdict(r) for r in rows]}, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
