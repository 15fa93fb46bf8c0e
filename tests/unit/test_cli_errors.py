"""The CLI's answer to bad input: one line naming the problem, exit status 2, nothing started."""

import os
import subprocess
import sys

import pytest

FABRICLAB = [sys.executable, "-m", "lab.cli"]


def run_cli(*args):
    cmd = FABRICLAB + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


@pytest.mark.parametrize("args, words", [
    (["run", "no-such-scenario"], "scenario: unknown scenario 'no-such-scenario'"),
    (["run", "ecmp-basic", "--policy", "roundrobin"], "policy: unknown policy 'roundrobin'"),
    (["run", "ecmp-basic", "--set", "traffic.flows=lots"], "traffic.flows: expected int"),
    (["run", "ecmp-basic", "--set", "flows"], "--set: expected key=value"),
    (["run", "ecmp-basic", "--set", "spines=0"], "topology.spines: 0 is out of range"),
    (["run", "ecmp-basic", "--set", "fabric_bw=100000"], "topology.fabric_bw"),
    (["topo", "fattree", "--k", "3"], "topology.k: a fat-tree needs an even k"),
])
def test_bad_input_exits_2_with_one_clear_line(args, words):
    before = set(os.listdir("/sys/class/net"))
    r = run_cli(*args)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert words in lines[0]
    assert "Traceback" not in r.stderr
    assert set(os.listdir("/sys/class/net")) == before   # nothing was started
