"""The lab's in-process netlink reads give what ``tc -s -j qdisc show`` and sysfs give.

Real queues with real drops: a veth pair whose sending end has the lab's own queue shape
(htb root, bfifo child) at htb's lowest rate, flooded with raw Ethernet frames (AF_PACKET
goes through the qdisc; no address, no route, nothing leaves the pair). The queue fills,
the rest is dropped, and it drains so slowly that drops and backlog hold still between a
``tc`` read and a netlink read. Once in the root namespace, once inside another namespace
(as a router's), through the socket kept open there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.measure import netlink as nl
from lab.measure import telemetry

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

A, B = "fltq0", "fltq1"
QUEUE_BYTES = 30_000
FRAMES = 400
FLOOD = f"""
import socket
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(({A!r}, 0))
frame = b"\\xff" * 6 + b"\\x02\\x00\\x00\\x00\\x00\\x01" + b"\\x88\\xb5" + bytes(986)
for _ in range({FRAMES}):
    try:
        s.send(frame)
    except OSError:     # ENOBUFS: the queue dropped it, which is the point
        pass
"""


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def in_ns(pid: int | None, *argv: str) -> list[str]:
    return [*(["nsenter", "-t", str(pid), "-n"] if pid else []), *argv]


def tc_roots(pid: int | None) -> dict[str, tuple[int, int]]:
    """tc's own word: {dev: (drops, backlog)} of each root qdisc."""
    entries = json.loads(sh(*in_ns(pid, "tc", "-s", "-j", "qdisc", "show")))
    return {q["dev"]: (int(q.get("drops", 0)), int(q.get("backlog", 0)))
            for q in entries if q.get("root")}


def shaped_pair(pid: int | None) -> None:
    """The veth pair with the lab's queue shape on A, in ``pid``'s namespace (or root)."""
    for cmd in (["ip", "link", "add", A, "type", "veth", "peer", "name", B],
                ["ip", "link", "set", A, "up"], ["ip", "link", "set", B, "up"],
                ["tc", "qdisc", "add", "dev", A, "root", "handle", "1:", "htb", "default", "1"],
                ["tc", "class", "add", "dev", A, "parent", "1:", "classid", "1:1", "htb",
                 "rate", "8kbit", "ceil", "8kbit", "burst", "1600"],
                ["tc", "qdisc", "add", "dev", A, "parent", "1:1", "handle", "10:", "bfifo",
                 "limit", str(QUEUE_BYTES)]):
        sh(*in_ns(pid, *cmd))


def flood(pid: int | None) -> None:
    sh(*in_ns(pid, sys.executable, "-c", FLOOD))


@pytest.fixture
def root_pair() -> Iterator[None]:
    shaped_pair(None)
    try:
        yield
    finally:
        subprocess.run(["ip", "link", "del", A], capture_output=True)


@pytest.fixture
def node_pid() -> Iterator[int]:
    """A process in a namespace of its own, standing in for a router's shell."""
    proc = subprocess.Popen(["unshare", "-n", "sleep", "300"])
    try:
        ns = Path(f"/proc/{proc.pid}/ns/net")
        own = os.stat("/proc/self/ns/net").st_ino
        for _ in range(200):                 # until unshare has moved it
            if ns.exists() and ns.stat().st_ino != own:
                break
            time.sleep(0.01)
        shaped_pair(proc.pid)
        yield proc.pid
    finally:
        nl.close_netlink([proc.pid])
        proc.kill()
        proc.wait()


def agree(pid: int | None) -> tuple[dict[str, tuple[int, int]], list[dict]]:
    """A netlink read between two tc reads; retried if the queue moved in between."""
    for _ in range(5):
        before = tc_roots(pid)
        mine = nl.qdisc_stats(pid)
        after = tc_roots(pid)
        if before == after:
            return mine, [before]
    return mine, [before, after]


@pytest.mark.parametrize("where", ["root", "namespace"])
def test_qdisc_stats_equal_tc_with_real_drops(where: str, request: pytest.FixtureRequest) -> None:
    pid = request.getfixturevalue("node_pid") if where == "namespace" else None
    if pid is None:
        request.getfixturevalue("root_pair")
    assert nl.qdisc_stats(pid)[A] == (0, 0)
    flood(pid)
    mine, tc = agree(pid)
    drops, backlog = mine[A]
    assert drops > 0, f"no drops after {FRAMES} frames into a {QUEUE_BYTES} B queue: {mine}"
    assert 0 < backlog <= QUEUE_BYTES
    # Every root qdisc, not only ours: the same devices and numbers as tc prints.
    assert mine in tc, f"netlink {mine} vs tc {tc}"
    # The socket is kept: a second read uses the same one.
    assert nl.netlink(pid) is nl.netlink(pid)


def test_snapshot_equals_sysfs_and_tc(root_pair: None) -> None:
    flood(None)
    port = telemetry.Port("x", 0, "y", A, 0.008)
    for _ in range(5):
        tc = tc_roots(None)[A]
        snap = telemetry.snapshot([port])[port]
        sysfs = {k: int(Path(f"/sys/class/net/{A}/statistics/{k}").read_text())
                 for k in ("tx_bytes", "tx_packets", "tx_dropped")}
        if (snap.qdisc_drops, snap.backlog_bytes) == tc_roots(None)[A] == tc and \
                snap.tx_bytes == sysfs["tx_bytes"]:
            break
    assert (snap.qdisc_drops, snap.backlog_bytes) == tc
    assert (snap.tx_bytes, snap.tx_packets, snap.tx_dropped) == \
        (sysfs["tx_bytes"], sysfs["tx_packets"], sysfs["tx_dropped"])
    assert snap.tx_bytes > 0 and snap.up
    gone = telemetry.snapshot([telemetry.Port("x", 1, "y", "fltq-none", 1.0)])
    assert not next(iter(gone.values())).up


def test_closed_namespace_reads_nothing() -> None:
    proc = subprocess.Popen(["unshare", "-n", "sleep", "300"])
    time.sleep(0.2)
    pid = proc.pid
    assert nl.qdisc_stats(pid) is not None
    proc.kill()
    proc.wait()
    assert nl.qdisc_stats(pid) == {}
    nl.close_netlink([pid])
