"""The largest RoCE incast that stays fidelity-valid on this machine, with PFC on.

Why: every RoCE sender is a ``roce_bw`` process pacing its own packets, and PFC adds pfcd's
1 kHz poll; on 2 cores these compete with the datapath whose timing every number depends on.
Each size is one real ``fabriclab run`` of pfc-hol's scenario through the CLI, its phases
replaced by one ``pfc`` phase (PFC on, no marking, congestion control none) and its flows
by N senders on leaf2 writing into h1 on leaf1 (``topology.hosts_per_leaf`` 12: at most 12
senders, and 24 hosts stay within pfcd's 32 namespaces). A size reports the run's verdict
and what made it: the least idle CPU, the datapath's wait, lossless drops (must be 0), the
incast's goodput, pfcd's CPU. The largest valid N is the answer.

Usage: FABRICLAB_LOCK_WAIT=1200 python bench/roce_incast.py [--senders 3,6,9,12]
       [--duration 5] [--json bench/out/roce_incast.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
FABRICLAB = [sys.executable, "-m", "lab.cli"]
HOSTS_PER_LEAF = 12
LOSSLESS_BYTES = 160_000


def scenario_file(n: int, tmp: Path) -> Path:
    """pfc-hol's scenario with one ``pfc`` phase and ``n`` senders into h1."""
    sc = yaml.safe_load((REPO / "scenarios" / "pfc-hol" / "scenario.yaml").read_text())
    sc["name"] = f"pfc-hol-incast-{n}"
    sc["topology"]["hosts_per_leaf"] = HOSTS_PER_LEAF
    sc["flows"] = [{"group": "incast", "to": "h1",
                    "from": [f"h{HOSTS_PER_LEAF + 1 + i}" for i in range(n)]}]
    sc["phases"] = {"pfc": {"pfc": {"enabled": True}}}
    # h1's port has 11 hosts' NICs and 2 spines as feeders: the headroom rule asks for
    # 130 kB above XOFF (the lab refuses less), so the lossless queue grows with the leaf
    sc["classes"]["lossless_bytes"] = LOSSLESS_BYTES
    sc.pop("baseline", None)
    path = tmp / f"incast-{n}.yaml"
    path.write_text(yaml.safe_dump(sc))
    return path


def one(n: int, duration: float, tmp: Path) -> dict:
    """One run with ``n`` senders: its verdict and numbers, or why it has none."""
    out = tmp / f"n{n}"
    argv = [*FABRICLAB, "run", str(scenario_file(n, tmp)), "--duration", f"{duration:g}",
            "--out", str(out)]
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900)
    if r.returncode != 0 or not (out / "result.json").is_file():
        return {"senders": n, "status": "failed", "why": (r.stderr or r.stdout).strip()[-300:]}
    res = json.loads((out / "result.json").read_text())
    m, fid = res["metrics"]["phases"]["pfc"], res["fidelity"]
    return {"senders": n, "status": "ok", "valid": fid["valid"],
            "cpu_idle_min_pct": fid["cpu_idle_min_pct"],
            "datapath_wait_max_ms": fid.get("datapath_wait_max_ms"),
            "lossless_drops": m["lossless_drops"], "pause_time_s": m["pause_time_s"],
            "incast_goodput_mbps": round(m["groups"]["incast"]["goodput_bps"] / 1e6, 2),
            "pfcd_cpu_pct": round((m["pfcd_cpu_per_s"] or 0) * 100, 2),
            "notes": fid["notes"][:3]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--senders", default="3,6,9,12")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="roce-incast-") as tmp:
        for n in (int(x) for x in args.senders.split(",")):
            row = one(n, args.duration, Path(tmp))
            rows.append(row)
            print(json.dumps(row), flush=True)
    valid = [r["senders"] for r in rows if r.get("valid")]
    summary = {"rows": rows, "largest_valid_senders": max(valid, default=None)}
    print(f"largest valid incast: {summary['largest_valid_senders']} senders")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
