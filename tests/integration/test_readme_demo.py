"""`make demo`, the README's first command, run as a user runs it: every policy in turn.

Nothing else runs a scenario under ``--policy all`` (the default of ``ecmp-basic``), the one
path that writes a result directory per policy and ``summary.json``. Set-up is left out
(``make -o setup``): ``make test`` has just run it, and a test must not re-point the
machine's ``fabriclab``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from lab.model.result import validate
from tests.integration.support import REPO


def test_make_demo_runs_every_policy() -> None:
    results = REPO / "results"
    before = set(results.iterdir()) if results.is_dir() else set()
    venv = Path(sys.executable).parent.parent
    r = subprocess.run(["make", "-o", "setup", "demo", f"VENV={venv}"], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    print(r.stdout[-4000:])
    new = sorted(set(results.iterdir()) - before) if results.is_dir() else []
    try:
        assert r.returncode == 0, r.stderr[-4000:]
        assert len(new) == 1 and re.fullmatch(r"ecmp-basic-.+", new[0].name), new
        summary = json.loads((new[0] / "summary.json").read_text())
        policies = [p.name for p in new[0].iterdir() if (p / "result.json").is_file()]
        assert len(policies) >= 3 and sorted(summary) == sorted(policies)
        for policy in policies:
            result = json.loads((new[0] / policy / "result.json").read_text())
            assert validate(result) == [] and result["policy"] == policy
            assert (new[0] / policy / "report.html").is_file()
            assert summary[policy]["imbalance"] == result["metrics"]["imbalance"]
    finally:
        for d in new:                  # the demo writes into the checkout, as a user's does
            shutil.rmtree(d)
