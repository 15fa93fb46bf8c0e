"""The full-kernel VM beside this machine: image build (cold and cached), boot to ready,
and per scenario the wall time, least idle CPU second and the lab's own CPU, VM beside host.

Usage: python bench/vm_lane.py [--cold] [--json FILE]

``--cold`` also builds the image from nothing in a throwaway cache (about 5 minutes on two
cores; the machine's own cache is left alone). Every VM run boots its own guest, as
``fabriclab vm run`` does for a user; the guest applies its rate profile by itself (under
TCG every rate and size x ``environment.TCG_RATE_SCALE``), which each row shows.
Runs one after another: a host run beside a TCG guest would measure the guest's load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab.measure import headroom

REPO = Path(__file__).resolve().parent.parent
FABRICLAB = [sys.executable, "-m", "lab.cli"]
#: What the VM lane runs in the guest (tests/vm/guest_session.sh), each as a user would.
SCENARIOS: list[tuple[str, list[str]]] = [
    ("ecmp-basic", ["--policy", "hash5", "--seed", "1", "--duration", "5"]),
    ("incast-ecn", []),
    ("streaming-incident", ["--set", "phases=before-upgrade,incident"]),
    ("allreduce-ecmp", []),
]
READY = re.compile(r"guest ready in ([\d.]+) s")


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 1):        # 1: a run that finished with a failed check
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-2000:])
        raise SystemExit(f"{' '.join(cmd)}: exit {proc.returncode}")
    return time.monotonic() - t0, proc.stdout + proc.stderr


def phase_idle(result: dict) -> dict[str, float]:
    """Each phase's least idle second (a one-phase run: its own), so a row shows which phase
    set the run's verdict."""
    details = result.get("phase_details") or {}
    if not details:
        return {result.get("phase") or "run": result["fidelity"]["cpu_idle_min_pct"]}
    return {name: min(p.get("cpu_idle_pct") or [100.0]) for name, p in details.items()}


def summary(text: str, name: str) -> list[str]:
    """The run's own summary as it printed it (paths, drops, marks, stalls), so the JSON
    shows that a profile kept each scenario's effect, not only its timing."""
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith(name + " ")]
    return [ln.rstrip() for ln in lines[starts[-1]:] if ln.strip()] if starts else []


def row(wall: float, result: dict) -> dict:
    fid = result["fidelity"]
    return {"wall_s": round(wall, 1), "cpu_idle_min_pct": fid["cpu_idle_min_pct"],
            "phase_idle_min_pct": phase_idle(result),
            "lab_cpu_pct": fid.get("lab_cpu_pct"), "valid": fid["valid"],
            "rate_scale": result["params"].get("rate_scale", 1.0),
            "datapath": result["environment"]["datapath"],
            "accelerator": (result["environment"].get("vm") or {}).get("accelerator")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    res: dict = {"image": {}, "scenarios": {}}
    with tempfile.TemporaryDirectory() as tmp:
        if args.cold:
            env = dict(os.environ, FABRICLAB_VM_CACHE=str(Path(tmp) / "cache"))
            res["image"]["cold_s"] = round(timed([*FABRICLAB, "vm", "build"], env)[0], 1)
            print(f"image, cold: {res['image']['cold_s']} s", flush=True)
        res["image"]["cached_s"] = round(timed([*FABRICLAB, "vm", "build"])[0], 1)
        print(f"image, cached: {res['image']['cached_s']} s", flush=True)
        # The verdicts are the lab's own, against its line: say which line that was.
        res["min_cpu_idle_pct"] = headroom.MIN_CPU_IDLE_PCT
        print(f"fidelity line: {headroom.MIN_CPU_IDLE_PCT:g} % idle", flush=True)
        for name, opts in SCENARIOS:
            out = {}
            for where, cmd in (("host", [*FABRICLAB, "run"]), ("vm", [*FABRICLAB, "vm", "run"])):
                folder = Path(tmp) / where / name
                wall, text = timed([*cmd, name, *opts, "--out", str(folder)])
                out[where] = row(wall, json.loads((folder / "result.json").read_text()))
                out[where]["summary"] = summary(text, name)
                if where == "vm" and (m := READY.search(text)):
                    out[where]["boot_to_ready_s"] = float(m.group(1))
            res["scenarios"][name] = out
            h, v = out["host"], out["vm"]
            print(f"{name:20s} host {h['wall_s']:6.1f} s, idle min {h['cpu_idle_min_pct']:4.0f} %"
                  f" | vm ({v['accelerator']}, rates x{v['rate_scale']:g}) {v['wall_s']:6.1f} s "
                  f"(boot {v.get('boot_to_ready_s', '?')} s), idle min "
                  f"{v['cpu_idle_min_pct']:4.0f} %, lab {v['lab_cpu_pct']} % of a core, "
                  f"{'valid' if v['valid'] else 'INVALID'}", flush=True)
            for where in ("host", "vm"):
                print(f"{'':20s} {where} per phase: " + ", ".join(
                    f"{n} {x:.0f} %" for n, x in out[where]["phase_idle_min_pct"].items()),
                    flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
