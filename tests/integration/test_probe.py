"""5-tuple traceroute (scapy) names the equal-cost link a flow takes - and agrees with the
links' own byte counters for that flow's real packets.

src1 - psw1 - r1 =(two equal-cost links)= r2 - dst1, with r1 hashing L4 fields
(fib_multipath_hash_policy=1), so flows that differ only in source port take different links.

Why the OVS switch psw1: over a bare veth, a packet keeps the hash its sending socket gave it
(``sk_txhash``, random per connection), and Linux's L4 multipath uses that hash instead of
the headers - measured here: the probe and the flow's own packets then disagree. A real
wire, like a switch's datapath, hands the router a packet without that hash, so the router
hashes the headers; the userspace OVS datapath does the same.
"""

from __future__ import annotations

import json
import os
import sys

from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.node import OVSSwitch
from mininet.topo import Topo

from lab.net.links import ShapedLink

SPORTS = [41001, 41002, 41003, 41004, 41005, 41006, 41007, 41008]
LINK_OF_HOP = {"10.12.1.2": "r1-eth1", "10.12.2.2": "r1-eth2"}


class TwoPaths(Topo):
    def build(self) -> None:
        for name in ("src1", "dst1", "r1", "r2"):
            self.addHost(name, ip=None)
        self.addSwitch("psw1", dpid="00000000000f0001", failMode="standalone",
                       datapath="user")
        opts = {"bw": 100, "queue_bytes": 150000}
        self.addLink("src1", "psw1", port1=0, port2=1, **opts)
        self.addLink("r1", "psw1", port1=0, port2=2, **opts)
        self.addLink("r1", "r2", port1=1, port2=1, **opts)
        self.addLink("r1", "r2", port1=2, port2=2, **opts)
        self.addLink("dst1", "r2", port1=0, port2=3, **opts)


def configure(net: Mininet) -> None:
    cmds = {
        "src1": ["ip addr add 10.1.0.1/24 dev src1-eth0", "ip route add default via 10.1.0.254"],
        "dst1": ["ip addr add 10.2.0.1/24 dev dst1-eth0", "ip route add default via 10.2.0.254"],
        "r1": ["ip addr add 10.1.0.254/24 dev r1-eth0", "ip addr add 10.12.1.1/24 dev r1-eth1",
               "ip addr add 10.12.2.1/24 dev r1-eth2",
               "ip route add 10.2.0.0/24 nexthop via 10.12.1.2 nexthop via 10.12.2.2"],
        "r2": ["ip addr add 10.2.0.254/24 dev r2-eth3", "ip addr add 10.12.1.2/24 dev r2-eth1",
               "ip addr add 10.12.2.2/24 dev r2-eth2", "ip route add 10.1.0.0/24 via 10.12.1.1"],
    }
    for r in ("r1", "r2"):
        # Forward, hash on ports, answer from the interface a probe came in on, no ICMP
        # rate limit (the probes come in quick succession).
        net.get(r).cmd("sysctl -qw net.ipv4.ip_forward=1 net.ipv4.fib_multipath_hash_policy=1 "
                       "net.ipv4.icmp_errors_use_inbound_ifaddr=1 net.ipv4.icmp_ratelimit=0 "
                       "net.ipv4.conf.all.rp_filter=0")
    for node, lines in cmds.items():
        for line in lines:
            out = net.get(node).cmd(line + " 2>&1")
            assert not out.strip(), f"{node}: {line}: {out}"


def tx_bytes(node, intf: str) -> int:
    return int(node.cmd(f"cat /sys/class/net/{intf}/statistics/tx_bytes"))


def test_probe_path_matches_the_links_counters():
    setLogLevel("warning")
    net = Mininet(topo=TwoPaths(), switch=OVSSwitch, link=ShapedLink, controller=None,
                  build=False)
    try:
        net.build()
        net.start()
        configure(net)
        src, dst, r1 = net.get("src1"), net.get("dst1"), net.get("r1")
        assert "1 received" in src.cmd("ping -c1 -W2 10.2.0.1")
        srv = dst.popen(["iperf3", "-s", "-B", "10.2.0.1", "-p", "5201"])
        try:
            seen = {}
            for sport in SPORTS:
                out = src.cmd(f"timeout 20 {sys.executable} -m lab.agents.probe --proto tcp "
                              f"--src 10.1.0.1 --dst 10.2.0.1 --sport {sport} --dport 5201 "
                              "--max-ttl 4")
                hops = json.loads(out.strip().splitlines()[-1])["hops"]
                assert [h["ttl"] for h in hops[:2]] == [1, 2], hops
                probed = LINK_OF_HOP[hops[1]["from"]]
                before = {i: tx_bytes(r1, i) for i in LINK_OF_HOP.values()}
                res = src.cmd(f"timeout 20 iperf3 -c 10.2.0.1 -B 10.1.0.1 -p 5201 --cport {sport} "
                              f"-t 1 -b 20M 2>&1")
                assert "receiver" in res, res
                grew = {i: tx_bytes(r1, i) - b for i, b in before.items()}
                counted = max(grew, key=grew.get)
                print(f"sport {sport}: probe says {probed}, counters {grew}")
                assert grew[counted] > 1_000_000 and min(grew.values()) < 200_000, grew
                assert probed == counted, (sport, probed, grew)
                seen[sport] = probed
            assert len(set(seen.values())) == 2, f"L4 hashing used one link only: {seen}"
        finally:
            srv.kill()
            srv.wait()
    finally:
        net.stop()
        left = [i for i in os.listdir("/sys/class/net") if i.startswith(("psw1", "r1-", "r2-"))]
        assert not left, left
