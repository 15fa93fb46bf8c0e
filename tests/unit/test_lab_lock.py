"""A run waits for the lab's lock as long as ``FABRICLAB_LOCK_WAIT`` says, and no longer.

The lock is the real one (``flock`` on a file in a temporary state folder): held here by a
second ``LabLock``, which conflicts with the session's as another process's would.
"""

from __future__ import annotations

import threading
import time

import pytest

from lab.machine import state
from lab.model.errors import BusyError


@pytest.fixture
def held(tmp_path, monkeypatch):
    """The lab's lock in a state folder of our own, held by someone else."""
    monkeypatch.setattr(state, "STATE_DIR", tmp_path)
    other = state.LabLock()
    other.acquire(0)
    yield other
    other.release()


def test_a_run_session_gives_up_after_the_lock_wait(held, monkeypatch):
    monkeypatch.setenv(state.LOCK_WAIT_ENV, "1.0")
    t0 = time.monotonic()
    with pytest.raises(BusyError) as err, state.run_session("test"):
        pass
    waited = time.monotonic() - t0
    assert 0.9 <= waited < 5, waited
    assert "another FabricLab run" in str(err.value)


def test_a_run_session_takes_its_turn_when_the_holder_lets_go(held, monkeypatch):
    monkeypatch.setenv(state.LOCK_WAIT_ENV, "30")
    threading.Timer(0.5, held.release).start()
    t0 = time.monotonic()
    with state.run_session("test") as (record, work):
        assert work.is_dir() and record.path.exists()
    assert 0.4 <= time.monotonic() - t0 < 10


def test_without_the_variable_a_busy_lab_is_refused_at_once(held, monkeypatch):
    monkeypatch.delenv(state.LOCK_WAIT_ENV, raising=False)
    t0 = time.monotonic()
    with pytest.raises(BusyError), state.run_session("test"):
        pass
    assert time.monotonic() - t0 < 0.5


def test_an_explicit_wait_wins_over_the_variable(held, monkeypatch):
    monkeypatch.setenv(state.LOCK_WAIT_ENV, "30")
    t0 = time.monotonic()
    with pytest.raises(BusyError), state.run_session("test", lock_wait_s=0.3):
        pass
    assert time.monotonic() - t0 < 5
