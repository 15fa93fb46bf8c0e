"""Start together: a program in a host says it is ready, then waits for the lab's go.

Programs the lab starts one after another start their traffic one after another too: a
Python start-up takes 0.2 s here and seconds under a VM's software CPU, so streams meant
to meet on an uplink, or checkpoints every GPU writes at once, would barely overlap. Each
program blocks SIGUSR1 first (an early go must not kill it), gets its sockets up, writes
its ready file and waits; the lab sends every one SIGUSR1 once all are ready.

This runs inside hosts: standard library only, nothing of the lab.
"""

from __future__ import annotations

import signal
from pathlib import Path


def hold() -> None:
    """Block the go signal until :func:`ready_then_wait` takes it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})


def ready_then_wait(ready_file: str | Path, timeout_s: float, text: str = "ready\n") -> bool:
    """Write ``ready_file``, then wait up to ``timeout_s`` for the go; False if none came."""
    Path(ready_file).write_text(text)
    return signal.sigtimedwait({signal.SIGUSR1}, timeout_s) is not None
