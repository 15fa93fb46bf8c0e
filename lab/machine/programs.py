"""Programs the lab starts inside hosts: spawned with a log and a run-record entry, then
started together.

One place for the lab's side of :mod:`lab.agents.golatch`: wait for every program's ready file,
then say go to all of them at once.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from lab.agents.workerbase import CLOCK_OFFSET_ENV
from lab.machine import remote
from lab.machine.environment import guest_vm

#: Seconds a program may take to say it is ready before it counts as hung. Only a guard:
#: a Python start-up takes 0.2 s here but seconds under a VM's software CPU (TCG).
READY_TIMEOUT_S = 60.0
#: Under TCG the guard is this many times longer: eight gloo ranks importing torch at once
#: took 75 s in the guest (one alone 14 s), and missed the rendezvous.
TCG_READY_FACTOR = 4.0


def ready_timeout_s() -> float:
    """How long programs may take to get ready on this machine (``READY_TIMEOUT_S``, times
    ``TCG_READY_FACTOR`` in a TCG guest)."""
    vm = guest_vm()
    tcg = vm is not None and vm.get("accelerator") == "tcg"
    return READY_TIMEOUT_S * (TCG_READY_FACTOR if tcg else 1.0)


def spawn(fabric: Any, host: str, argv: list[str], log: Path, what: str,
          cls: str) -> subprocess.Popen:
    """Start ``argv`` in ``host``'s namespace, output to ``log``, its PID in the run record
    (so an interrupted run kills exactly it), in CPU class ``cls``
    (``lab.machine.cpuclass``: below the datapath).

    A host on another worker of a cluster writes its files where the head would, in the
    run's directory that worker keeps at the same path (:func:`lab.machine.remote.fetch`
    brings them back), and stamps its times on the head's clock; its output comes back
    through its ssh.
    """
    if getattr(fabric.host(host), "isRemote", False):
        remote.run_at(host, ["mkdir", "-p", str(log.parent)])
        argv = ["env", f"{CLOCK_OFFSET_ENV}={remote.clock_offset_s(host):.6f}", *argv]
    out = open(log, "wb")  # noqa: SIM115 - the child owns it
    proc = fabric.host(host).popen(argv, stdout=out, stderr=subprocess.STDOUT)
    fabric.record.add_pid(proc.pid, what)
    classify(fabric, host, proc.pid, cls)
    return proc


def classify(fabric: Any, host: str, pid: int, cls: str) -> None:
    """Put a program the lab started in ``host`` into CPU class ``cls`` (below the datapath);
    a program on another worker of a cluster runs under that worker's scheduler."""
    if not getattr(fabric.host(host), "isRemote", False):
        fabric.cpu.add(pid, cls)


def wait_ready(ready: list[Path], procs: list[Any],
               stop_at_death: bool = False) -> tuple[list[str], list[str]]:
    """Wait for each program's ready file; returns the files of those that exited without
    one and of those still waiting when ``ready_timeout_s()`` ran out.

    ``stop_at_death``: return as soon as one has died.
    """
    deadline = time.monotonic() + ready_timeout_s()
    while True:
        dead = [str(r) for r, p in zip(ready, procs, strict=True)
                if p.poll() is not None and not r.exists()]
        waiting = [str(r) for r, p in zip(ready, procs, strict=True)
                   if p.poll() is None and not r.exists()]
        if not waiting or (dead and stop_at_death) or time.monotonic() > deadline:
            return dead, waiting
        time.sleep(0.02)


def go(ready: list[Path], procs: list[Any]) -> None:
    """Say go to every program once all are ready.

    One that died or hangs gets no wait beyond READY_TIMEOUT_S; its log and its missing
    output say what happened, and the others go.
    """
    wait_ready(ready, procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGUSR1)
