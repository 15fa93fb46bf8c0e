"""Kill -9 mid-run, then `fabriclab clean`: nothing of the lab remains and the next run works.

The checks look for the lab's own things only - interfaces named like Mininet's, OVS bridges,
processes carrying the run marker, run records - and never touch anything else.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

from tests.integration.support import CLI, REPO, fabriclab, lab_leftovers


def _as_at_a_terminal() -> None:
    """Ctrl-C as a terminal delivers it: a test runner started in the background (``cmd &``
    in a script) ignores SIGINT, its children inherit that, and Python then never turns
    SIGINT into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_run(*args: str) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "run", "ecmp-basic", "--policy", "hash5", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_as_at_a_terminal)


def wait_for_line(proc: subprocess.Popen, needle: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    seen = []
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return line
    raise AssertionError(f"never saw {needle!r}: {''.join(seen)}")


def test_kill9_mid_traffic_then_clean(tmp_path):
    proc = start_run("--duration", "30", "--out", str(tmp_path / "killed"))
    wait_for_line(proc, "flows for")
    time.sleep(1.0)
    left = lab_leftovers()
    assert left["bridges"] and left["interfaces"] and left["processes"] and left["records"]
    assert left["cgroups"], left      # the iperf3 programs' CPU class
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    print(f"left after kill -9: {({k: len(v) for k, v in left.items()})}")
    r = fabriclab("clean")
    assert "removed run" in r.stdout
    assert not any(lab_leftovers().values())
    # the next run works on the cleaned machine
    out = tmp_path / "next"
    fabriclab("run", "ecmp-basic", "--policy", "hash5", "--duration", "2", "--out", str(out))
    assert json.loads((out / "result.json").read_text())["metrics"]["pingall_loss_pct"] == 0


def test_kill9_during_bringup_then_clean(tmp_path):
    proc = start_run("--duration", "30", "--out", str(tmp_path / "killed"))
    wait_for_line(proc, "bringing up")
    time.sleep(0.8)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    fabriclab("clean")
    assert not any(lab_leftovers().values())


def test_sigterm_tears_down_without_clean(tmp_path):
    proc = start_run("--duration", "30", "--out", str(tmp_path / "term"))
    wait_for_line(proc, "flows for")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) != 0
    assert not any(lab_leftovers().values())


def test_ctrl_c_tears_down_without_clean(tmp_path):
    proc = start_run("--duration", "30", "--out", str(tmp_path / "int"))
    wait_for_line(proc, "flows for")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    assert not any(lab_leftovers().values())


def test_clean_leaves_a_foreign_bridge_alone():
    """A bridge the lab did not create survives `fabriclab clean` and blocks nothing."""
    name = "fl-foreign0"
    subprocess.run(["ovs-vsctl", "add-br", name, "--", "set", "bridge", name,
                    "datapath_type=netdev"], check=True)
    try:
        fabriclab("clean")
        out = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True)
        assert name in out.stdout.split()
    finally:
        subprocess.run(["ovs-vsctl", "--if-exists", "del-br", name], check=True)


def test_a_same_named_foreign_bridge_is_refused_not_deleted(tmp_path):
    subprocess.run(["ovs-vsctl", "add-br", "spine1", "--", "set", "bridge", "spine1",
                    "datapath_type=netdev"], check=True)
    try:
        r = fabriclab("run", "ecmp-basic", "--policy", "hash5", "--duration", "2",
                      "--out", str(tmp_path / "x"), check=False)
        assert r.returncode == 2
        assert "spine1 already exist" in r.stderr
        out = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True)
        assert out.stdout.split() == ["spine1"]
    finally:
        subprocess.run(["ovs-vsctl", "--if-exists", "del-br", "spine1"], check=True)
