"""The lab's agent on a cluster worker: its lock, its record, its counters, its clock.

Started by the head over ssh for one run (``lab.machine.remote.Agent``), it reads one JSON
request per line on stdin and answers one JSON line on stdout. It runs nothing of the
emulation itself (Mininet's cluster edition starts the nodes through their own ssh
shells); it is the worker's half of what the lab does around the emulation:

* the worker's lab lock, taken at start (a worker already running a lab refuses the run),
  and a run record under the head's run id, to which the head adds every bridge,
  interface and process it creates there; the record is applied when the agent ends,
  whether the head said ``exit`` or its ssh simply went away;
* the worker's counters, read locally by the same code a one-machine run uses
  (``lab.measure.telemetry``): port snapshots, OVS per-flow counters, and a sampler thread
  whose series go back to the head at the end of a window;
* its monotonic clock, for the head to measure the worker's offset.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from lab.machine import environment, remote, state
from lab.measure import telemetry
from lab.model.errors import LabError
from lab.net.wire import Qdisc, count_wire_bytes


def _ports(raw: list[list[Any]]) -> list[telemetry.Port]:
    return [telemetry.Port(str(n), int(p), str(peer), str(i), float(bw))
            for n, p, peer, i, bw in raw]


class AgentSession:
    """One run's state on this worker; ``handle`` answers one request."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.lock = state.LabLock()
        self.record: state.RunRecord | None = None
        self.sampler: telemetry.Sampler | None = None

    def open(self) -> dict[str, Any]:
        try:
            self.lock.acquire(0.0)
        except LabError as exc:
            raise LabError("", f"{os.uname().nodename} is already running a lab "
                           f"({exc.message}); wait for it or stop it") from None
        os.environ[state.RUN_ENV] = self.run_id
        self.record = state.RunRecord.new(self.run_id)
        work = state.STATE_DIR / "work" / self.run_id
        work.mkdir(parents=True, exist_ok=True)
        self.record.paths.append(str(work))
        self.record.save()
        return {"version": environment.lab_version(), "mono": time.monotonic(),
                "cores": os.cpu_count(), "host": os.uname().nodename,
                "kernel": os.uname().release, "pid": os.getpid()}

    def close(self) -> dict[str, Any]:
        left: dict[str, int] = {}
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        if self.record is not None:
            left = state.remove(self.record)
            self.record = None
        self.lock.release()
        return {"removed": left}

    # -- requests ------------------------------------------------------------------------
    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        cmd = req.get("cmd")
        fn = getattr(self, f"do_{cmd}", None)
        if fn is None:
            raise LabError("", f"unknown request {cmd!r}")
        return fn(req)

    def do_clock(self, _req: dict[str, Any]) -> dict[str, Any]:
        return {"mono": time.monotonic()}

    def do_nic(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"counters": remote.nic_counters(str(req["address"]))}

    def do_check_free(self, req: dict[str, Any]) -> dict[str, Any]:
        taken = sorted(set(req["bridges"]) & state.existing_bridges())
        taken += sorted(set(req["interfaces"]) & state.existing_interfaces())
        return {"taken": taken}

    def do_record(self, req: dict[str, Any]) -> dict[str, Any]:
        assert self.record is not None
        self.record.bridges += req.get("bridges", [])
        self.record.interfaces += req.get("interfaces", [])
        for pid, what in req.get("pids", []):
            self.record.pids.append({"pid": int(pid), "start": state.proc_start_time(int(pid)),
                                     "what": str(what)})
        self.record.save()
        return {}

    def do_run(self, req: dict[str, Any]) -> dict[str, Any]:
        out = subprocess.run(req["argv"], input=req.get("input"), capture_output=True,
                             text=True, check=False, timeout=float(req.get("timeout", 60)))
        return {"rc": out.returncode, "stdout": out.stdout, "stderr": out.stderr}

    def do_fetch(self, req: dict[str, Any]) -> dict[str, Any]:
        """Every file under ``path``, inside this run's work directory only (programs'
        outputs, for the head to read where it reads its own)."""
        top = Path(str(req["path"])).resolve()
        work = (state.STATE_DIR / "work" / self.run_id).resolve()
        if not top.is_relative_to(work):
            raise LabError("", f"{top} is not in this run's work directory")
        files = {}
        for f in sorted(top.rglob("*")) if top.is_dir() else []:
            if f.is_file():
                files[str(f.relative_to(top))] = base64.b64encode(f.read_bytes()).decode()
        return {"files": files}

    def do_stab(self, req: dict[str, Any]) -> dict[str, Any]:
        for pid, qdiscs in req["entries"]:
            count_wire_bytes(pid, [Qdisc(**q) for q in qdiscs])
        return {}

    def do_snapshot(self, req: dict[str, Any]) -> dict[str, Any]:
        read = telemetry.drained_snapshot if req.get("drained") else telemetry.snapshot
        snap = read(_ports(req["ports"]))
        return {"ports": {p.intf: asdict(s) for p, s in snap.items()}}

    def do_flows(self, req: dict[str, Any]) -> dict[str, Any]:
        bridges = list(req["bridges"])
        if req.get("settled"):
            got = telemetry.settled_flow_counters(bridges)
        else:
            got = telemetry.flow_counters(bridges)
        return {"flows": {br: {str(c): v for c, v in d.items()} for br, d in got.items()}}

    def do_sample_start(self, req: dict[str, Any]) -> dict[str, Any]:
        self.sampler = telemetry.Sampler(_ports(req["ports"]), hz=float(req["hz"]))
        self.sampler.start()
        while self.sampler.t0 == 0.0:
            time.sleep(0.001)
        return {"t0": self.sampler.t0}

    def do_sample_stop(self, _req: dict[str, Any]) -> dict[str, Any]:
        s = self.sampler
        if s is None:
            return {}
        s.stop()
        self.sampler = None
        return {"t0": s.t0, "cpu": s.cpu,
                "lab_cpu": [(t, {str(k): v for k, v in d.items()}) for t, d in s.lab_cpu],
                "series": {p.intf: asdict(ser) for p, ser in s.series.items()}}


def serve(run_id: str, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    """Answer requests until ``exit`` or the end of stdin; then remove what the run made."""
    session = AgentSession(run_id)

    def say(obj: dict[str, Any]) -> None:
        stdout.write(json.dumps(obj) + "\n")
        stdout.flush()

    try:
        say(session.open())
    except LabError as exc:
        say({"error": exc.message, "field": exc.field})
        return 2
    try:
        for line in stdin:
            try:
                req = json.loads(line)
            except ValueError:
                say({"error": f"not a JSON request: {line[:60]!r}"})
                continue
            if req.get("cmd") == "exit":
                say(session.close())
                return 0
            try:
                say(session.handle(req))
            except LabError as exc:
                say({"error": exc.message, "field": exc.field})
            except (OSError, subprocess.SubprocessError, KeyError, TypeError,
                    ValueError) as exc:
                say({"error": f"{req.get('cmd')}: {type(exc).__name__}: {exc}"})
    finally:
        session.close()
    return 0
