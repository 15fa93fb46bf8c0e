"""The CLI's answer to bad input: one line naming the problem, exit status 2, nothing started.

"Nothing started" is checked on what this command alone could have made, so another run
on the machine (coming up or going down meanwhile) cannot fail the test, nor hide a
leftover: the command gets a state folder of its own, where the lab writes its lock and a
run's record before it creates anything, and (as root) a network namespace of its own, in
which any interface it made is still there to be seen once it has exited.
"""

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lab.machine import state as lab_state

REPO = Path(__file__).resolve().parents[2]
FABRICLAB = [sys.executable, "-m", "lab.cli"]
#: A loaded machine starts Python slowly; this bounds a hang, not the CLI's speed.
TIMEOUT_S = 300
OWN_NETNS = os.geteuid() == 0 and shutil.which("unshare") is not None


def run_isolated(state: Path, argv: list[str], cwd: Path = REPO,
                 ) -> tuple[subprocess.CompletedProcess, list[str] | None]:
    """``argv`` with its own state folder (and, as root, its own network namespace); its
    outcome and the interfaces its namespace holds after it exited (None: not root)."""
    env = dict(os.environ, FABRICLAB_STATE=str(state), PYTHONPATH=str(REPO))
    env.pop("FABRICLAB_RUN", None)
    env["FABRICLAB_LOCK_WAIT"] = "0"        # a held lock is refused at once, never waited for
    if not OWN_NETNS:
        return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S,
                              cwd=cwd, env=env), None
    # The command, then the namespace's interfaces on stdout's last line.
    script = textwrap.dedent("""
        import socket, subprocess, sys
        r = subprocess.run(sys.argv[1:])
        # From the kernel (not /sys, which shows the namespace that mounted it).
        print("\\ninterfaces:", " ".join(sorted(n for _, n in socket.if_nameindex())))
        sys.exit(r.returncode)
    """)
    r = subprocess.run(["unshare", "--net", sys.executable, "-c", script, *argv],
                       capture_output=True, text=True, timeout=TIMEOUT_S, cwd=cwd, env=env)
    *_, last = r.stdout.rstrip("\n").splitlines() or [""]
    assert last.startswith("interfaces:"), r.stdout
    return r, last.split()[1:]


def run_cli(state: Path, *args: str, cwd: Path = REPO,
            ) -> tuple[subprocess.CompletedProcess, list[str] | None]:
    return run_isolated(state, [*FABRICLAB, *args], cwd)


def assert_nothing_started(state: Path, interfaces: list[str] | None,
                           ours: tuple[str, ...] = ()) -> None:
    """No lock taken, no run recorded, no work folder (``ours``: what the test made there
    itself); no interface but loopback."""
    made = sorted(str(p.relative_to(state)) for p in state.rglob("*")) if state.exists() \
        else []
    assert made == sorted(ours), made
    if interfaces is not None:
        assert interfaces == ["lo"], interfaces


def test_the_check_sees_what_a_command_leaves(tmp_path):
    """The isolation hides other runs, not this command's own leftovers."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "lock").write_text("")
    with pytest.raises(AssertionError):
        assert_nothing_started(state, None)
    if not OWN_NETNS:
        pytest.skip("a namespace of its own needs root")
    r, interfaces = run_isolated(tmp_path / "empty", ["ip", "link", "add", "fct0", "type",
                                                      "veth", "peer", "name", "fct1"])
    assert r.returncode == 0, r.stderr
    assert interfaces == ["fct0", "fct1", "lo"]
    with pytest.raises(AssertionError):
        assert_nothing_started(tmp_path / "empty", interfaces)


@pytest.mark.parametrize("args, words", [
    (["run", "no-such-scenario"], "scenario: unknown scenario 'no-such-scenario'"),
    (["run", "ecmp-basic", "--policy", "roundrobin"], "policy: unknown policy 'roundrobin'"),
    (["run", "ecmp-basic", "--set", "traffic.flows=lots"], "traffic.flows: expected int"),
    (["run", "ecmp-basic", "--set", "flows"], "--set: expected key=value"),
    (["run", "ecmp-basic", "--set", "spines=0"], "topology.spines: 0 is out of range"),
    (["run", "ecmp-basic", "--set", "fabric_bw=100000"], "topology.fabric_bw"),
    (["topo", "fattree", "--k", "3"], "topology.k: a fat-tree needs an even k"),
])
def test_bad_input_exits_2_with_one_clear_line(args, words, tmp_path):
    state = tmp_path / "state"
    r, interfaces = run_cli(state, *args)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert words in lines[0]
    assert "Traceback" not in r.stderr
    assert_nothing_started(state, interfaces)


LOOPING = """
from controllers.policies import HashPolicy


class Loop(HashPolicy):
    granularity = "flow"

    def choose(self, flow, switch, ports):
        while True:
            pass
"""

WRONG_PORT = """
from controllers.policies import HashPolicy


class Wrong(HashPolicy):
    granularity = "flow"

    def choose(self, flow, switch, ports):
        return 99
"""


@pytest.mark.parametrize("code, words", [
    (LOOPING, "choose() did not finish within 10 s (an endless loop?); stopped"),
    (WRONG_PORT, "choose() returned 99 at"),
])
def test_a_policy_file_that_cannot_decide_is_refused_before_the_run(code, words, tmp_path,
                                                                  monkeypatch):
    """As `grade` does: the file answers the run's own flows in a child with a time limit
    first, so an endless choose() is one line after 10 s, not a controller that never
    programs the switches and a traceback when bring-up gives up."""
    (tmp_path / "policy.py").write_text(code)
    state = tmp_path / "state"
    # The lab's lock, held here: were the file not refused first, the run would stop at
    # the lock (a different line) rather than build a fabric beside other people's runs.
    monkeypatch.setattr(lab_state, "STATE_DIR", state)
    held = lab_state.LabLock()
    held.acquire(0)
    try:
        t0 = time.monotonic()
        r, interfaces = run_cli(state, "run", "ecmp-basic", "--policy", "policy.py",
                                "--duration", "3", cwd=tmp_path)
        took = time.monotonic() - t0
    finally:
        held.release()
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("fabriclab: error: policy-file: policy.py: "), lines[0]
    assert words in lines[0], lines[0]
    assert took < 60, took
    assert_nothing_started(state, interfaces, ours=("lock",))
