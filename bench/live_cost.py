"""What `fabriclab run --live` costs a run: the lab's own CPU (``fidelity.lab_cpu_pct``: this
process's threads, the live server's among them, and the controller) and the least idle
second (``cpu_idle_min_pct``), without the live view, with it and nobody watching, and with
headless Chromium watching it (from a network namespace of its own, as the test does).

    bench/live_cost.py -- ecmp-one-pair --duration 5 --runs 2

The numbers are the machine's of the moment: on 2 shared cores, repeat, and run it alone.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.netns_browser import NetnsBrowser  # noqa: E402 - the repo's root first

MODES = ("plain", "live", "live+browser")


def one(mode: str, scenario: list[str], tmp: Path) -> dict[str, float]:
    out = tmp / f"{mode}-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "lab.cli", "run", *scenario, "--out", str(out)]
    if mode != "plain":
        cmd.append("--live")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    assert proc.stdout is not None
    browser = None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        m = re.search(r"live view: (http://127\.0\.0\.1:(\d+)/)", line)
        if m and mode == "live+browser":
            browser = NetnsBrowser(int(m.group(2)), m.group(1), tmp / "profile", (1400, 900))
    if proc.wait() != 0:
        raise SystemExit("".join(lines))
    if browser is not None:
        browser.close()
    fid = json.loads((out / "result.json").read_text())["fidelity"]
    return {"lab_cpu_pct": fid["lab_cpu_pct"], "cpu_idle_min_pct": fid["cpu_idle_min_pct"],
            "valid": fid["valid"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--json", help="also write the numbers here")
    ap.add_argument("scenario", nargs="+", help="after --: the run's arguments")
    args = ap.parse_args()
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.runs):
            for mode in MODES:            # interleaved: the machine's drift hits each alike
                r = one(mode, args.scenario, Path(tmp))
                rows[mode].append(r)
                print(f"{mode:14s} lab_cpu_pct {r['lab_cpu_pct']:5.1f}  "
                      f"cpu_idle_min_pct {r['cpu_idle_min_pct']:5.1f}  valid {r['valid']}",
                      flush=True)
    for mode, rs in rows.items():
        print(f"{mode:14s} mean lab_cpu_pct "
              f"{statistics.mean(r['lab_cpu_pct'] for r in rs):5.1f}  mean cpu_idle_min_pct "
              f"{statistics.mean(r['cpu_idle_min_pct'] for r in rs):5.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
