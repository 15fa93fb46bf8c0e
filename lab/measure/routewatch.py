"""When a device leaves a router's route and when it comes back, as the kernel says it.

A failover's numbers (how long BFD and BGP took to take a cut path away, and to bring it
back) are read from the router's own kernel: the watch sleeps on the namespace's route
notifications and, on each one, reads the route to the prefix over the kept-open
rtnetlink socket. Nothing is spawned: polling ``ip route`` through ``nsenter`` every 10 ms
cost a process start a hundred times a second, CPU the datapath needed during exactly
the seconds being timed, and a busy machine could leave the poll behind the change.
"""

from __future__ import annotations

import errno
import select
import threading
import time

from lab.measure.netlink import netlink, rtnl_socket

#: rtnetlink multicast groups: IPv4 route changes (a bit of the bind mask) and nexthop
#: object changes (group 32, joined by number: a mask has only 32 bits).
RTMGRP_IPV4_ROUTE, RTNLGRP_NEXTHOP = 0x40, 32
SOL_NETLINK, NETLINK_ADD_MEMBERSHIP = 270, 1
#: How long the watch sleeps without a notification before it reads the route anyway: a
#: missed notification (the socket's buffer overran) costs at most this much precision.
RECHECK_S = 0.1
#: How soon a stopped watch notices, whatever its re-read interval.
STOP_S = 0.1


class RouteWatch(threading.Thread):
    """Watches the route to ``prefix`` in the namespace of ``pid`` for ``dev``.

    ``gone_at``: the first moment ``dev`` was no longer among the route's devices;
    ``back_at``: the first moment after that it was again (``time.time()``). ``error``
    says why there is no answer: the watch failed, or ``dev`` was not in the route when
    the watch started (a cut of it could not be timed).
    """

    def __init__(self, pid: int, prefix: str, dev: str, recheck_s: float = RECHECK_S) -> None:
        super().__init__(daemon=True, name="fabriclab-route-watch")
        self.pid, self.prefix, self.dev, self.recheck_s = pid, prefix, dev, recheck_s
        self.gone_at: float | None = None
        self.back_at: float | None = None
        self.error: str | None = None
        self._stop_evt = threading.Event()
        self._sock = rtnl_socket(pid, RTMGRP_IPV4_ROUTE)
        self._sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, RTNLGRP_NEXTHOP)
        self._sock.setblocking(False)
        first = netlink(pid).route_devs(prefix)
        if dev not in first:
            self.error = f"{dev} is not in the route to {prefix} before the cut: {first}"

    def run(self) -> None:
        try:
            read_at = time.monotonic()
            while not self._stop_evt.is_set():
                ready, _, _ = select.select([self._sock], [], [], min(self.recheck_s, STOP_S))
                now = time.time()
                if ready:
                    self._drain()
                elif time.monotonic() - read_at < self.recheck_s:
                    continue
                read_at = time.monotonic()
                self._see(netlink(self.pid).route_devs(self.prefix), now)
        except OSError as e:
            self.error = f"the route watch failed: {e}"
        finally:
            self._sock.close()

    def _drain(self) -> None:
        """Discard the notifications queued: each only says 'read the route again'."""
        while True:
            try:
                self._sock.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError as e:      # ENOBUFS: notifications were lost; the read resyncs
                if e.errno != errno.ENOBUFS:
                    raise

    def _see(self, devs: list[str], now: float) -> None:
        if self.dev not in devs and self.gone_at is None:
            self.gone_at = now
        elif self.dev in devs and self.gone_at is not None and self.back_at is None:
            self.back_at = now

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=5)
