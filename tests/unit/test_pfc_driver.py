"""controllers.pfc.Pfcd and the controller's ``pfc`` request, on a stand-in for pfcd (a
script that acts its part: the ready line, SIGTERM, the counters, a refusal): starting
waits for the ready line, a refusal is one line with pfcd's stderr, stopping returns the
counters, and the controller runs one at a time and stops it on shutdown."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from controllers import pfc
from controllers.pfc import Feeder, PfcConfig, Pfcd, PfcError, WatchedPort
from controllers.requests import ControlRequests

#: What the stand-in does is chosen by FAKE_PFCD_MODE: ready (then counters on SIGTERM),
#: refuse (exit 2 with pfcd's one line), mute (never ready), unresumed (exit 1 on SIGTERM).
FAKE = f"""#!{sys.executable}
import json, os, signal, sys, time
cfg, out = sys.argv[1:]
mode = os.environ.get("FAKE_PFCD_MODE", "ready")
if mode == "refuse":
    sys.stderr.write(f"pfcd: {{cfg}}:2: poll_us: must be 100..1000000\\n")
    sys.exit(2)
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
if mode != "mute":
    print("pfcd: ready, 1 watched, 1 feeders, 1 namespaces", flush=True)
while not stop:
    time.sleep(0.01)
if mode == "unresumed":
    sys.stderr.write("pfcd: could not resume pfcfake0\\n")
    sys.exit(1)
json.dump({{"polls": 7, "config": open(cfg).read()}}, open(out, "w"))
"""

CONFIG = PfcConfig((WatchedPort("-", "pfcfake1", 20_000, 10_000,
                                (Feeder("-", "pfcfake0", 25_000_000, 50_000_000),)),),
                   2_500_000)


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    path = tmp_path / "fake-pfcd"
    path.write_text(FAKE)
    path.chmod(0o755)
    return path


def test_started_when_ready_and_stopped_with_its_counters(fake: Path, tmp_path: Path) -> None:
    engine = Pfcd(CONFIG, fake, tmp_path / "run" / "pfcd.json", tmp_path / "pfcd.log")
    engine.start()
    try:
        assert engine.running and engine.pid is not None
        assert engine.config_path == tmp_path / "run" / "pfcd.conf"
        assert "ready" in (tmp_path / "pfcd.log").read_text()
    finally:
        counters = engine.stop()
    assert counters["polls"] == 7 and counters["config"] == CONFIG.text()
    assert not engine.running


@pytest.mark.parametrize("mode, match", [
    ("refuse", r"^pfcd did not start: pfcd exited with status 2: pfcd: .*pfcd\.conf:2: "
               r"poll_us: must be 100\.\.1000000$"),
    ("mute", r"^pfcd did not start: no ready line within 0\.5 s: no stderr$"),
])
def test_a_failure_to_start_is_one_line_with_what_pfcd_said(
        fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str,
        match: str) -> None:
    monkeypatch.setenv("FAKE_PFCD_MODE", mode)
    engine = Pfcd(CONFIG, fake, tmp_path / "pfcd.json", tmp_path / "pfcd.log")
    with pytest.raises(PfcError, match=match) as err:
        engine.start(timeout_s=0.5)
    assert len(str(err.value).splitlines()) == 1
    assert not engine.running                      # a mute one is killed, by its PID


def test_a_bad_exit_sets_the_classes_back_and_says_both(
        fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pfcd could not resume a class: the driver tries (tc here finds no such device,
    which the error says too) and reports pfcd's own line."""
    monkeypatch.setenv("FAKE_PFCD_MODE", "unresumed")
    engine = Pfcd(CONFIG, fake, tmp_path / "pfcd.json", tmp_path / "pfcd.log")
    engine.start()
    with pytest.raises(PfcError, match=r"^pfcd exited with status 1; could not set back: "
                                       r"- pfcfake0: `tc class show dev pfcfake0 .*: "
                                       r"pfcd: could not resume pfcfake0$"):
        engine.stop()


class App(ControlRequests):
    """The state of ``FabricApp`` the pfc request uses, without OpenFlow."""

    def __init__(self, tmp_path: Path) -> None:
        self._lock = threading.Lock()
        self._switches: dict[str, Any] = {}
        self._pfcd = None
        self._pfc_lock = threading.Lock()
        self.cfg = SimpleNamespace(build_dir=str(tmp_path / "build"),
                                   control_socket=str(tmp_path / "controller.sock"))


def test_the_controller_runs_one_pfcd_and_replies_its_counters(
        fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pfc.Pfcd, "build", staticmethod(lambda build_dir=None: fake))
    app = App(tmp_path)
    on = {"cmd": "pfc", "config": CONFIG.to_dict()}
    reply = app.handle_request(on)
    assert reply["ok"] and reply["watched"] == 1 and reply["feeders"] == 1, reply
    again = app.handle_request(on)
    assert not again["ok"] and again["error"].startswith("pfc: pfcd is already running"), again
    off = app.handle_request({"cmd": "pfc", "off": True})
    assert off["ok"] and off["counters"]["polls"] == 7, off
    assert (tmp_path / "pfcd.conf").read_text() == CONFIG.text()    # beside the socket
    assert app.handle_request({"cmd": "pfc", "off": True}) == {
        "ok": False, "error": "pfc: off: pfcd is not running"}


@pytest.mark.parametrize("req, error", [
    ({"cmd": "pfc"}, 'pfc: expected "config": {...} to start pfcd or "off": true'),
    ({"cmd": "pfc", "off": 1}, 'pfc: expected "config"'),
    ({"cmd": "pfc", "off": True, "config": {}}, 'pfc: expected "config"'),
    ({"cmd": "pfc", "config": {"pause_bps": 8, "ports": []}}, "pfc: config.ports: expected"),
])
def test_a_bad_pfc_request_names_what_is_wrong(tmp_path: Path, req: dict[str, Any],
                                               error: str) -> None:
    reply = App(tmp_path).handle_request(req)
    assert not reply["ok"] and reply["error"].startswith(error), reply


def test_shutdown_stops_a_running_pfcd(fake: Path, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pfc.Pfcd, "build", staticmethod(lambda build_dir=None: fake))
    app = App(tmp_path)
    assert app.handle_request({"cmd": "pfc", "config": CONFIG.to_dict()})["ok"]
    pid = app._pfcd.pid
    app.stop_pfc()
    assert app._pfcd is None and (tmp_path / "pfcd.json").is_file()
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.01)                               # reaped by stop: the PID is gone
    assert not os.path.exists(f"/proc/{pid}")
