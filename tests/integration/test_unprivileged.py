"""The CLI run as an unprivileged user: what needs root is refused before anything starts,
and what does not (planning) still works. Root is needed here only to become another user.
"""

import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FABRICLAB = [sys.executable, "-m", "lab.cli"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root to drop to another user")


def run_cli(*args: str, user: int) -> subprocess.CompletedProcess[str]:
    cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *FABRICLAB,
           *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO)


def test_not_root_is_refused_before_anything_starts():
    r = run_cli("run", "ecmp-basic", user=65534)
    assert r.returncode == 2
    assert "must run as root" in r.stderr


def test_cli_planning_needs_no_root():
    """As an unprivileged user nothing can be started, and the plan still prints."""
    r = run_cli("topo", "fattree", "--k", "4", "--workers", "2", user=65534)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("fattree: 20 switches")
