"""The worker's agent, spoken to as the head does (one JSON line each way), without ssh:
its hello, its record and lock, its refusals, and what it removes at the end."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from lab.machine import environment, state
from lab.measure import agent


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(state, "STATE_DIR", tmp_path)
    return tmp_path


def talk(run_id: str, *requests: dict) -> list[dict]:
    out = io.StringIO()
    agent.serve(run_id, io.StringIO("".join(json.dumps(r) + "\n" for r in requests)), out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_agent_holds_a_record_and_removes_it(state_dir: Path) -> None:
    hello, clock, bad, recorded, bye = talk(
        "t-1", {"cmd": "clock"}, {"cmd": "bogus"},
        {"cmd": "record", "interfaces": ["fabriclab-test-nonexistent"]}, {"cmd": "exit"})
    assert hello["version"] == environment.lab_version() and hello["pid"] > 0
    assert clock["mono"] >= hello["mono"]
    assert "unknown request 'bogus'" in bad["error"]
    assert recorded == {}
    assert bye == {"removed": {"processes": 0, "bridges": 0, "interfaces": 0}}
    assert not (state.records_dir() / "t-1.json").exists()
    assert not (state_dir / "work" / "t-1").exists()


def test_agent_refuses_a_worker_already_running_a_lab(state_dir: Path) -> None:
    lock = state.LabLock()
    lock.acquire(0.0)
    try:
        (reply,) = talk("t-2", {"cmd": "clock"})
    finally:
        lock.release()
    assert "already running a lab" in reply["error"]
    assert not (state.records_dir() / "t-2.json").exists()


def test_agent_cleans_up_when_its_stdin_closes(state_dir: Path) -> None:
    """The head gone (even by kill -9): its ssh closes, the agent's stdin ends."""
    hello, = talk("t-3")
    assert "version" in hello
    assert not (state.records_dir() / "t-3.json").exists()
    lock = state.LabLock()
    lock.acquire(0.0)                # released: the next run takes it
    lock.release()


def test_facts_say_whether_a_lab_runs_here(state_dir: Path) -> None:
    """`fabriclab cluster facts` (what setup and check compare) reads the lock, not takes it."""
    from lab.machine import workers
    assert workers.facts()["busy"] is False
    lock = state.LabLock()
    lock.acquire(0.0)
    try:
        assert workers.facts()["busy"] is True
    finally:
        lock.release()
    assert workers.facts()["lab"] == environment.lab_version()
