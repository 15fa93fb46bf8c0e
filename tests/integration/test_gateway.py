"""Off-fabric traffic through a gateway host, with real packets, under every policy.

h8 plays a router: it owns 198.51.100.1 (an address outside the fabric's subnet) and h1
reaches it through a route via h8. The fabric has no route for 198.51.100.0/24; it forwards
the frames because they are addressed to h8's MAC, its gateway.
"""

from __future__ import annotations

import pytest

from lab import run
from lab.machine import environment
from lab.net.topologies import LeafSpine

OFF_FABRIC = "198.51.100.1"


@pytest.mark.parametrize("policy", ["ovs-select", "hash5", "hash-l3"])
def test_ping_and_tcp_through_a_gateway(policy):
    env = environment.detect()
    runtime = environment.pick_runtime(env.runtimes, None)
    with run.fabric_session("gw", LeafSpine(), env, runtime, policy, 1) as fab:
        fab.gateways = frozenset({"h8"})
        fab.start()
        h1, h8 = fab.host("h1"), fab.host("h8")
        h8.cmd(f"ip addr add {OFF_FABRIC}/32 dev lo")
        h1.cmd(f"ip route add {OFF_FABRIC}/32 via {h8.IP()}")
        out = h1.cmd(f"ping -c 3 -i 0.2 -W 2 {OFF_FABRIC}")
        assert "3 received" in out, out
        # A TCP transfer too: reactive policies install its entries on packet-in.
        srv = h8.popen(["iperf3", "-s", "-1", "-B", OFF_FABRIC, "-p", "5299"])
        try:
            h8.cmd("sleep 0.3")
            out = h1.cmd(f"iperf3 -c {OFF_FABRIC} -p 5299 -t 1 -b 10M")
            assert "receiver" in out and "error" not in out, out
        finally:
            srv.kill()
            srv.wait()
        status = fab.controller.request({"cmd": "status"})
        if policy != "ovs-select":
            assert status["decisions"] > 0       # the gateway traffic went through packet-in
