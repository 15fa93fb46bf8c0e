"""The route watch that times a failover reads what ``ip route show exact`` reads, and
sees a device leave a route and come back, from the kernel's notifications.

A namespace of its own, two veth pairs, and a multipath route whose nexthops are changed
the two ways routing daemons change them: the route replaced (its nexthops in the route),
and a nexthop group replaced under a route that names it (FRR's zebra installs nexthop
objects where the kernel has them).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.measure import netlink as nl
from lab.measure.routewatch import RouteWatch

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

PREFIX = "203.0.113.0/26"
BOTH = f"{PREFIX} nexthop via 10.9.0.2 dev rw0 nexthop via 10.9.1.2 dev rw1"


def ns(pid: int, cmd: str) -> str:
    out = subprocess.run(["nsenter", "-t", str(pid), "-n", *cmd.split()],
                         capture_output=True, text=True, check=True)
    return out.stdout


@pytest.fixture
def router() -> Iterator[int]:
    """A process in a namespace of its own with two routed ports, standing in for a router."""
    proc = subprocess.Popen(["unshare", "-n", "sleep", "300"])
    try:
        own = os.stat("/proc/self/ns/net").st_ino
        for _ in range(200):                 # until unshare has moved it
            p = Path(f"/proc/{proc.pid}/ns/net")
            if p.exists() and p.stat().st_ino != own:
                break
            time.sleep(0.01)
        for i in (0, 1):
            ns(proc.pid, f"ip link add rw{i} type veth peer name rwp{i}")
            ns(proc.pid, f"ip addr add 10.9.{i}.1/24 dev rw{i}")
            ns(proc.pid, f"ip link set rw{i} up")
            ns(proc.pid, f"ip link set rwp{i} up")
            ns(proc.pid, f"ip neigh add 10.9.{i}.2 lladdr 02:00:00:00:00:0{i} dev rw{i}")
        yield proc.pid
    finally:
        nl.close_netlink([proc.pid])
        proc.kill()
        proc.wait()


def ip_devs(pid: int) -> list[str]:
    routes = json.loads(ns(pid, f"ip -j route show exact {PREFIX}") or "[]")
    return sorted(nh["dev"] for r in routes for nh in r.get("nexthops", [r]))


def until(cond, timeout: float = 5.0) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_route_devs_equal_ip_route(router: int) -> None:
    assert nl.netlink(router).route_devs(PREFIX) == [] == ip_devs(router)
    ns(router, f"ip route add {BOTH}")
    assert nl.netlink(router).route_devs(PREFIX) == ["rw0", "rw1"] == ip_devs(router)
    ns(router, f"ip route replace {PREFIX} via 10.9.1.2 dev rw1")
    assert nl.netlink(router).route_devs(PREFIX) == ["rw1"] == ip_devs(router)
    # Another prefix length or table is not this route.
    ns(router, "ip route add 203.0.113.0/25 via 10.9.0.2 dev rw0")
    ns(router, f"ip route add {PREFIX} via 10.9.0.2 dev rw0 table 7")
    assert nl.netlink(router).route_devs(PREFIX) == ["rw1"] == ip_devs(router)


@pytest.mark.parametrize("how", ["route", "nexthop-group"])
def test_watch_times_a_device_leaving_and_returning(router: int, how: str) -> None:
    if how == "route":
        ns(router, f"ip route add {BOTH}")
        cut = f"ip route replace {PREFIX} via 10.9.1.2 dev rw1"
        back = f"ip route replace {BOTH}"
    else:
        ns(router, "ip nexthop add id 1 via 10.9.0.2 dev rw0")
        ns(router, "ip nexthop add id 2 via 10.9.1.2 dev rw1")
        ns(router, "ip nexthop add id 10 group 1/2")
        ns(router, f"ip route add {PREFIX} nhid 10")
        cut, back = "ip nexthop replace id 10 group 2", "ip nexthop replace id 10 group 1/2"
    assert ip_devs(router) == ["rw0", "rw1"]
    # No re-read without a notification within the test: what the watch sees, the kernel
    # told it.
    watch = RouteWatch(router, PREFIX, "rw0", recheck_s=60)
    watch.start()
    try:
        time.sleep(0.3)
        assert watch.gone_at is None and watch.error is None
        t_cut = time.time()
        ns(router, cut)
        assert until(lambda: watch.gone_at is not None), ip_devs(router)
        assert ip_devs(router) == ["rw1"]
        t_back = time.time()
        ns(router, back)
        assert until(lambda: watch.back_at is not None), ip_devs(router)
    finally:
        watch.stop()
    assert not watch.is_alive() and watch.error is None
    assert t_cut <= watch.gone_at < t_back <= watch.back_at


def test_watch_of_a_device_not_in_the_route_says_so(router: int) -> None:
    ns(router, f"ip route add {PREFIX} via 10.9.1.2 dev rw1")
    watch = RouteWatch(router, PREFIX, "rw0")
    assert watch.error is not None and "rw0" in watch.error and "rw1" in watch.error
