"""Full-kernel link paths with real packets, run INSIDE the guest (kernel with netem) by
tests/vm/guest_session.sh: delay on a link is the RTT, the byte queue drops at its limit
under a root netem, telemetry reads the byte queue. (The scenarios' full-kernel results,
WAN delay and the dctcp phase, are checked by tests/vm/test_vm_lane.py.)

Every test skips, saying why, on a kernel without netem (the CI host).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lab.machine.environment import qdisc_available

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "lab.cli"]

HAVE_NETEM = os.geteuid() == 0 and qdisc_available("netem delay 1ms")
pytestmark = pytest.mark.skipif(not HAVE_NETEM, reason="needs root and a kernel with netem "
                                "(the full-kernel guest)")


def _cc_available() -> list[str]:
    return Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()


@pytest.fixture
def pair():
    """Two Mininet hosts joined by one ShapedLink; the test passes the link's parameters."""
    from mininet.log import setLogLevel
    from mininet.net import Mininet

    from lab.net.links import ShapedIntf, ShapedLink
    setLogLevel("warning")
    nets = []

    def make(**link: object):
        ShapedIntf.netem_available = True
        net = Mininet(topo=None, controller=None, link=ShapedLink, build=False,
                      autoSetMacs=False)
        a = net.addHost("fkla", ip="10.99.0.1/24")
        b = net.addHost("fklb", ip="10.99.0.2/24")
        net.addLink(a, b, **link)
        nets.append(net)
        net.build()
        return a, b

    yield make
    for net in nets:
        net.stop()


def _min_rtt_ms(node, ip: str, count: int = 20) -> float:
    out = node.cmd(f"ping -n -q -c {count} -i 0.05 {ip}")
    m = re.search(r"= ([\d.]+)/", out)
    assert m, out
    return float(m.group(1))


def _qdiscs(node, dev: str) -> dict[str, dict]:
    """{handle: qdisc} with counters, as ``tc -s -j`` prints them."""
    return {q["handle"]: q for q in json.loads(node.cmd(f"tc -s -j qdisc show dev {dev}"))}


@pytest.mark.parametrize("delay_ms", [5.0, 20.0])
def test_a_link_with_delay_d_has_an_rtt_of_2d(pair, delay_ms):
    a, _b = pair(bw=100, queue_bytes=100_000, delay_ms=delay_ms)
    q = _qdiscs(a, a.defaultIntf().name)
    assert q["2:"]["kind"] == "netem" and q["2:"].get("root"), q
    assert q["1:"]["kind"] == "htb" and q["10:"]["kind"] == "bfifo", q
    rtt = _min_rtt_ms(a, "10.99.0.2")
    print(f"delay {delay_ms} ms each way: min RTT {rtt:.3f} ms")
    assert 2 * delay_ms <= rtt < 2 * delay_ms + 3.0      # + the guest's own (TCG) latency


def _overload(a, b, dev: str, rate: str, seconds: float, udp: bool) -> tuple[list, dict]:
    """iperf3 a -> b while sampling a's qdiscs; (samples, final counters)."""
    b.cmd("iperf3 -s -1 -D -B 10.99.0.2 -p 5299")
    time.sleep(0.5)
    samples: list[dict] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            out = subprocess.run(["nsenter", "-t", str(a.pid), "-n", "tc", "-s", "-j", "qdisc",
                                  "show", "dev", dev], capture_output=True, text=True).stdout
            samples.append({q["handle"]: q for q in json.loads(out or "[]")})
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    flags = f"-u -b {rate} -l 1400" if udp else "-C cubic"
    a.cmd(f"iperf3 -c 10.99.0.2 -p 5299 -t {seconds} {flags} -J > /dev/null")
    stop.set()
    t.join(10)
    return samples, _qdiscs(a, dev)


@pytest.mark.parametrize("udp, slack", [(True, 1500), (False, 65_536 + 1500)])
def test_the_byte_queue_drops_at_its_limit_under_a_root_netem(pair, udp, slack):
    q_bytes = 30_000
    a, b = pair(bw=10, queue_bytes=q_bytes, delay_ms=5.0)
    dev = a.defaultIntf().name
    samples, end = _overload(a, b, dev, "40M", 4, udp)
    leaf = [s["10:"]["backlog"] for s in samples if "10:" in s]
    root = [s["2:"]["backlog"] for s in samples if "2:" in s]
    print(f"{'udp' if udp else 'tcp'}: {len(samples)} samples, leaf 10: backlog max "
          f"{max(leaf)} B, root netem backlog max {max(root)} B; drops leaf "
          f"{end['10:']['drops']}, root {end['2:']['drops']}")
    assert max(leaf) <= q_bytes + slack
    assert max(leaf) > q_bytes // 2                      # the queue did fill
    if udp:
        assert end["10:"]["drops"] > 0
    # Every drop is the byte queue's, and the root (what telemetry reads) counts them all.
    assert end["2:"]["drops"] == end["10:"]["drops"]


def test_telemetry_reads_the_byte_queue_not_the_delay_line(pair):
    """What the lab reports as a port's queue is the bfifo's backlog: under overload it
    stays within the byte limit even though netem holds a delay line's worth in flight."""
    from lab.measure.netlink import qdisc_stats
    q_bytes = 20_000
    a, b = pair(bw=20, queue_bytes=q_bytes, delay_ms=20.0)
    dev = a.defaultIntf().name
    b.cmd("iperf3 -s -1 -D -B 10.99.0.2 -p 5298")
    qdisc_stats(a.pid)           # the namespace's socket opened before the traffic starts
    time.sleep(0.5)
    seen: list[int] = []
    proc = a.popen(["iperf3", "-c", "10.99.0.2", "-p", "5298", "-u", "-b", "60M", "-l", "1400",
                    "-t", "3"], stdout=subprocess.DEVNULL)
    while proc.poll() is None:
        seen.append(qdisc_stats(a.pid).get(dev, (0, 0))[1])
    print(f"telemetry backlog max {max(seen)} B over {len(seen)} samples")
    print(a.cmd(f"tc -s qdisc show dev {dev}"))     # what the kernel holds, to say why
    # Read throughout the overload, and the queue filled: else the bound proves nothing.
    assert len(seen) >= 10 and max(seen) > q_bytes / 2, (len(seen), max(seen))
    assert max(seen) <= q_bytes + 1500, seen[:20]


def test_under_a_root_netem_the_port_still_counts_wire_bytes(pair):
    """The size table (lab/net/wire.py) sits on the htb below the netem: each 1442-byte
    UDP frame costs the port 1466 bytes (its 24 bytes of preamble, gap and FCS)."""
    a, b = pair(bw=10, queue_bytes=100_000, delay_ms=2.0)
    dev = a.defaultIntf().name
    assert "tsize 8192" in a.cmd(f"tc -d qdisc show dev {dev} handle 1:")
    b.cmd("iperf3 -s -1 -D -B 10.99.0.2 -p 5297")
    time.sleep(0.5)
    before = _qdiscs(a, dev)["1:"]
    a.cmd("iperf3 -c 10.99.0.2 -p 5297 -u -b 4M -l 1400 -t 2 > /dev/null")
    after = _qdiscs(a, dev)["1:"]
    frames = after["packets"] - before["packets"]
    wire = after["bytes"] - before["bytes"]
    print(f"{frames} frames, {wire} wire bytes at the htb")
    # iperf3's datagrams, plus its few control packets (TCP, short): within them
    assert frames > 500
    assert abs(wire - frames * 1466) <= 20 * 1466, (wire, frames)
