"""The management network on a running leaf-spine: a second, slow LAN that every host
reaches over its second interface, shaped and counted like every lab link, and that the
fabric does not carry.

One leaf-spine (2 spines, 2 leaves, one host each) with ``mgmt_bw`` 10 Mbit/s, far below
its 50 Mbit/s host links: a TCP stream h1 -> h2 over the management addresses must be
capped near 10 Mbit/s, counted on the management switch's port to h2, and absent from
every fabric port. That is the "collective on the wrong interface" the lab will reproduce.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from lab import run
from lab.machine import environment
from lab.measure import telemetry
from lab.net.topobase import MGMT_SWITCH
from lab.net.topologies import make_topology

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, OVS)")

MGMT_BW, HOST_BW, SECONDS = 10.0, 50.0, 4
#: A lab link's rate is a wire rate: TCP's ceiling is 1448/1538 of it (9.41 Mbit/s at 10).
#: A port runs ahead of its wire by one TSO packet at most, nothing over seconds.
CEILING = MGMT_BW * 1448 / 1538
RATE_LO, RATE_HI = 0.9 * CEILING, 1.02 * CEILING
#: The port to the receiver counts every payload byte plus its headers: at least the
#: payload, at most the payload as full 1514-byte frames of 1448 (TSO super-packets count
#: their headers once, so the truth lies between), plus 1 % for the iperf3 control
#: connection and the pings.
COUNT_LO, COUNT_HI = 1.0, 1514 / 1448 + 0.01
#: What the fabric's ports may carry meanwhile: nothing of the stream (a few hundred bytes
#: of controller packet-outs at most).
FABRIC_SLACK_BYTES = 20_000


def ovs(*args: str) -> str:
    return subprocess.run(["ovs-vsctl", "--timeout=10", *args], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_management_lan_is_separate_slow_and_counted() -> None:
    env = environment.detect()
    runtime = environment.pick_runtime(env.runtimes, None)
    topo = make_topology({"type": "leafspine", "spines": 2, "leaves": 2, "hosts_per_leaf": 1,
                          "host_bw": HOST_BW, "fabric_bw": 100.0, "mgmt_bw": MGMT_BW})
    with run.fabric_session("test-mgmt-net", topo, env, runtime, "ovs-select", 1) as fabric:
        fabric.start()
        assert MGMT_SWITCH in fabric.record.bridges          # removed by the lab's cleanup
        # A plain L2 switch: no controller, standalone; the controller was never told of it.
        assert ovs("get-controller", MGMT_SWITCH) == ""
        assert ovs("get-fail-mode", MGMT_SWITCH) == "standalone"
        assert fabric.controller is not None
        assert MGMT_SWITCH not in {s["name"] for s in fabric.controller.config["switches"]}
        assert fabric.pingall() == 0.0
        assert fabric.pingall_mgmt() == 0.0

        mgmt = {h["name"]: h for h in fabric.desc["mgmt"]["hosts"]}
        src, dst = mgmt["h1"], mgmt["h2"]
        fabric_ports = telemetry.fabric_ports(fabric.desc)
        mgmt_ports = telemetry.mgmt_ports(fabric.desc)
        assert {p.role for p in mgmt_ports} == {"mgmt"}
        to_dst = next(p for p in mgmt_ports if p.peer == "h2")
        server = fabric.host("h2").popen(["iperf3", "-s", "-1", "-B", dst["ip"]],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        fabric.record.add_pid(server.pid, "test iperf3 server")
        try:
            time.sleep(0.5)
            before = telemetry.snapshot(fabric_ports + mgmt_ports)
            client = fabric.host("h1").popen(
                ["iperf3", "-c", dst["ip"], "-B", src["ip"], "-t", str(SECONDS), "-C", "cubic",
                 "-J"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            fabric.record.add_pid(client.pid, "test iperf3 client")
            out, err = client.communicate(timeout=SECONDS + 20)
            assert client.returncode == 0, err
            after = telemetry.drained_snapshot(fabric_ports + mgmt_ports)
            server.wait(timeout=10)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()

    received = json.loads(out)["end"]["sum_received"]
    mbps = received["bits_per_second"] / 1e6
    payload = received["bytes"]
    counted = after[to_dst].tx_bytes - before[to_dst].tx_bytes
    on_fabric = {p.intf: after[p].tx_bytes - before[p].tx_bytes for p in fabric_ports}
    print(f"mgmt TCP {mbps:.2f} Mbit/s; {payload} B payload, {counted} B counted on "
          f"{to_dst.intf} ({counted / payload:.4f}), drops "
          f"{after[to_dst].qdisc_drops - before[to_dst].qdisc_drops}; fabric ports {on_fabric}")
    assert RATE_LO <= mbps <= RATE_HI, mbps
    assert mbps < HOST_BW / 2
    assert COUNT_LO <= counted / payload <= COUNT_HI, (counted, payload)
    assert sum(on_fabric.values()) <= FABRIC_SLACK_BYTES, on_fabric
