"""Sockets inside other network namespaces, opened from this process.

A socket belongs to the namespace it was created in for its whole life, whichever thread
later uses it. So the lab can talk to every host's namespace from one process (netlink for
counters, raw ICMP for reachability) instead of spawning a program in each, which on two
cores (and far more under QEMU's TCG) costs more than the work itself. ``setns`` moves only
the calling thread, so each socket is made by a short-lived thread that enters the
namespace and ends right after: the lab's own threads never change namespace.
"""

from __future__ import annotations

import ctypes
import functools
import os
import socket
import threading
from collections.abc import Callable
from typing import Any


@functools.cache
def _libc() -> ctypes.CDLL:
    # Named, not looked up: ctypes' find_library spawns ``ldconfig -p``.
    return ctypes.CDLL("libc.so.6", use_errno=True)


def netns_inode(pid: int | None) -> int:
    """The inode of ``pid``'s network namespace (this process's for None): two pids share a
    namespace exactly when these are equal."""
    return os.stat(f"/proc/{pid if pid is not None else 'self'}/ns/net").st_ino


def socket_in(pid: int | None, make: Callable[[], socket.socket]) -> socket.socket:
    """``make()`` run inside the network namespace of ``pid`` (here, for None)."""
    if pid is None:
        return make()
    from pyroute2 import netns

    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    box: dict[str, Any] = {}

    def enter() -> None:
        try:
            netns.setns(fd, flags=0, libc=_libc())    # this thread only; it ends right after
            box["sock"] = make()
        except OSError as e:
            box["error"] = e

    try:
        t = threading.Thread(target=enter, name="fabriclab-netns", daemon=True)
        t.start()
        t.join()
    finally:
        os.close(fd)
    if "error" in box:
        raise box["error"]
    return box["sock"]
