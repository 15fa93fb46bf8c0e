"""A lab port is a wire, checked on real packets: its qdisc counts every frame's bytes plus
the 24 bytes of preamble, gap and FCS that an Ethernet wire spends on it (the size table of
lab/net/wire.py), TSO packets frame by frame, and no TSO packet is longer than the cap.

Two namespaces joined by one veth, the sending end shaped exactly as lab/net/links.py shapes
every port; a TCP stream and a few pings cross it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from controllers.marking import TCP_FRAME_HEADER_BYTES, WIRE_OVERHEAD_BYTES
from lab.net.links import MAX_TSO_FRAMES, TSO_LIMIT, tc_commands
from lab.net.wire import Qdisc, count_wire_bytes

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, tc)")

RATE_MBIT, QUEUE = 50.0, 150_000


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout


@pytest.fixture()
def wire() -> Iterator[tuple[str, str, subprocess.Popen]]:
    tag = f"fw{os.getpid() % 100000}"
    a, b = f"{tag}a", f"{tag}b"
    sh("ip", "netns", "add", a)
    sh("ip", "netns", "add", b)
    holder = None
    try:
        sh("ip", "link", "add", "wa", "netns", a, "type", "veth", "peer", "name", "wb",
           "netns", b)
        for ns, dev, addr in ((a, "wa", "10.79.0.1/24"), (b, "wb", "10.79.0.2/24")):
            # no IPv6 chatter, as on the lab's links (lab/net/links.py)
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
            sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, *TSO_LIMIT.split(), "up")
        holder = subprocess.Popen(["ip", "netns", "exec", a, "sleep", "120"])
        for cmd in tc_commands("wa", RATE_MBIT, QUEUE):
            sh("ip", "netns", "exec", a, *cmd.split())
        time.sleep(0.2)                       # the holder is in its namespace
        count_wire_bytes(holder.pid, [Qdisc("wa")])
        yield a, b, holder
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], check=False)


def counters(ns: str) -> tuple[int, int, int, int]:
    """(qdisc bytes, qdisc packets, link tx bytes, link tx packets) of the shaped end."""
    q = json.loads(sh("ip", "netns", "exec", ns, "tc", "-s", "-j", "qdisc", "show", "dev",
                      "wa"))
    root = next(x for x in q if x.get("root"))
    link = json.loads(sh("ip", "-n", ns, "-s", "-j", "link", "show", "wa"))[0]
    tx = link["stats64"]["tx"]
    return root["bytes"], root["packets"], tx["bytes"], tx["packets"]


def test_the_qdisc_counts_every_frame_on_the_wire(wire):
    a, b, _ = wire
    server = subprocess.Popen(["ip", "netns", "exec", b, "iperf3", "-s", "-1", "-B",
                               "10.79.0.2"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        q0, f0, l0, s0 = counters(a)
        out = json.loads(sh("ip", "netns", "exec", a, "iperf3", "-c", "10.79.0.2", "-t", "2",
                            "-C", "cubic", "-J"))
        q1, f1, l1, s1 = counters(a)
    finally:
        server.kill()
        server.wait()
    assert out["end"]["sum_received"]["bytes"] > 1_000_000
    frames, skbs = f1 - f0, s1 - s0
    # The qdisc counts a TSO packet's segments as packets: more frames than skbs means TSO
    # ran, and never more than the cap per skb.
    assert skbs < frames <= skbs * MAX_TSO_FRAMES
    # Every frame beyond the first of a TSO packet repeats the headers; every frame costs
    # its 24 bytes of wire. Exact, save the few frames (ARP) that are not TCP.
    expected = (l1 - l0) + (frames - skbs) * TCP_FRAME_HEADER_BYTES \
        + frames * WIRE_OVERHEAD_BYTES
    assert abs((q1 - q0) - expected) <= 4 * 84, (q1 - q0, expected)


def test_a_short_frame_costs_the_shortest_wire_frame(wire):
    a, _, _ = wire
    q0, f0, l0, s0 = counters(a)
    sh("ip", "netns", "exec", a, "ping", "-c", "5", "-i", "0.2", "-s", "0", "10.79.0.2")
    q1, f1, l1, s1 = counters(a)
    assert f1 - f0 == s1 - s0 >= 5
    # a 42-byte ICMP frame (or ARP) is 84 on the wire; each packet here is one of those
    assert q1 - q0 == (f1 - f0) * 84, (q1 - q0, f1 - f0, l1 - l0)
