"""A graded answer runs in the jail (``lab.machine.jail``): not root, with only its input and
``/work`` to see, no network, under limits. Hostile answers, each as a student could write
it, fail with one line, leave nothing behind, and cost seconds; an honest one still works.

Each answer is an analysis answer (``who_waited(result)`` style: a function of a JSON
input), run through ``lab.grade.sandbox`` as ``fabriclab grade`` runs it. The reference
result an answer must not read is a real file at a path the answer knows.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from lab import grade
from lab.grade import exercise

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the jail's mounts)")

#: A hostile answer, stopped: one line, within this many seconds of its start (the time
#: limit is 10 s; a fork bomb meets the process limit well before).
STOPPED_WITHIN_S = 12.0

HOSTILE = {
    "reads-the-reference": ("""
def f(data):
    return open({ref!r}).read()
""", "FileNotFoundError"),
    "imports-the-diagnosis": ("""
def f(data):
    import importlib
    return sorted(importlib.import_module("lab.analysis.gpuwait").FIXES)
""", "ModuleNotFoundError: No module named 'lab'"),
    "writes-outside-its-scratch": ("""
def f(data):
    for path in ("/answer/x", "/usr/x", "/x", {ref_dir!r} + "/x"):
        try:
            open(path, "w").write("x")
        except OSError as e:
            last = e
        else:
            return "wrote " + path
    raise last
""", "FileNotFoundError"),
    "opens-a-socket": ("""
def f(data):
    import socket
    socket.create_connection(("127.0.0.1", 6653), timeout=2)
    return "connected"
""", "Network is unreachable"),
    "fork-bomb": ("""
def f(data):
    import os
    while True:
        os.fork()
""", "BlockingIOError"),
    "becomes-root": ("""
def f(data):
    import os
    os.setuid(0)
""", "PermissionError"),
}


def nobodys_processes() -> list[str]:
    out = subprocess.run(["ps", "-u", "nobody", "-o", "pid=,args="], capture_output=True,
                         text=True)
    return [ln for ln in out.stdout.splitlines() if ln.strip()]


def run_answer(tmp_path: Path, code: str) -> tuple[dict, float]:
    answer = tmp_path / "answer.py"
    answer.write_text(code)
    (tmp_path / "input.json").write_text(json.dumps({"phases": {}}))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    t0 = time.monotonic()
    out = grade.sandbox("analysis", answer, {"function": "f",
                                             "argument": str(tmp_path / "input.json"),
                                             "load_json": True}, 10.0, scratch)
    return out, time.monotonic() - t0


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_answer_fails_with_one_line_and_leaves_nothing(tmp_path: Path,
                                                                 name: str) -> None:
    ref_dir = tmp_path / "reference-who-waited"
    ref_dir.mkdir()
    (ref_dir / "result.json").write_text('{"diagnosis": "the answer"}')
    code, words = HOSTILE[name]
    before = nobodys_processes()
    out, took = run_answer(tmp_path, code.format(ref=str(ref_dir / "result.json"),
                                                 ref_dir=str(ref_dir)))
    assert out["ok"] is False, out
    assert words in out["error"] and "\n" not in out["error"], out["error"]
    assert took < STOPPED_WITHIN_S, took
    assert list(ref_dir.iterdir()) == [ref_dir / "result.json"]
    assert nobodys_processes() == before
    mounts = Path("/proc/self/mounts").read_text()
    assert str(tmp_path) not in mounts


def test_an_honest_answer_runs_as_nobody_on_its_input(tmp_path: Path) -> None:
    out, _ = run_answer(tmp_path, """
import os
def f(data):
    open("/work/notes.txt", "w").write("mine")
    return {"data": data, "uid": os.getuid(), "seen": sorted(os.listdir("/")),
            "input": sorted(os.listdir("/input"))}
""")
    assert out["ok"], out
    v = out["value"]
    assert v["data"] == {"phases": {}} and v["uid"] == 65534 and v["input"] == ["input.json"]
    assert "work" in v["seen"] and not {"root", "etc", "home", "var"} & set(v["seen"])
    assert (tmp_path / "scratch" / "analysis-work" / "notes.txt").read_text() == "mine"


def test_the_who_waited_solution_runs_in_the_jail(tmp_path: Path) -> None:
    """The solution needs nothing the jail hides: on a made-up result of no phases it
    answers (the graded run's 11 of 11 is the lessons' test)."""
    sol = exercise.REPO / "scenarios" / "gpu-wait" / "solutions" / "who_waited.py"
    (tmp_path / "input.json").write_text(json.dumps(
        {"metrics": {"phases": {}}, "phase_details": {}, "topology": {}}))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = grade.sandbox("analysis", sol, {"function": "who_waited",
                                          "argument": str(tmp_path / "input.json"),
                                          "load_json": True}, 10.0, scratch)
    assert out == {"ok": True, "value": {}, "seconds": out.get("seconds")}, out
