"""The management network on a running leaf-spine: a second, slow LAN that every host
reaches over its second interface, shaped and counted like every lab link, and that the
fabric does not carry.

One leaf-spine (2 spines, 3 leaves, one host each) with ``mgmt_bw`` 10 Mbit/s, far below
its 50 Mbit/s host links: a TCP stream h1 -> h2 over the management addresses must be
capped near 10 Mbit/s, counted on the management switch's port to h2, and absent from
every fabric port. That is the "collective on the wrong interface" the lab will reproduce.
Then two UDP senders overload that port: every datagram lost is one its queue dropped.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

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
#: Each of two UDP senders offers 0.8x the management rate (under its own NIC's, which
#: would otherwise drop first), so the switch's port to the receiver gets 1.6x its rate.
UDP_MBPS, UDP_BYTES = 0.8 * MGMT_BW, 1400
#: Every datagram iperf3 lost is one that port dropped: no other queue is over its rate.
#: Slack for datagrams in flight when a sender's last report is cut.
DROP_SLACK = 10


def ovs(*args: str) -> str:
    return subprocess.run(["ovs-vsctl", "--timeout=10", *args], capture_output=True,
                          text=True, check=True).stdout.strip()


def iperf(fabric: Any, pairs: list[tuple[str, str, str]], ports: list[telemetry.Port],
          *args: str) -> tuple[list[dict], dict, dict]:
    """One iperf3 client per (client host, its source address, server address), all at
    once, each to a server of its own on the server's host; their JSON reports and the
    ports' counters before and (drained) after."""
    servers, clients = [], []
    hosts = {str(h["ip"]): str(h["name"]) for h in fabric.desc["mgmt"]["hosts"]}
    try:
        for i, (_, _, server_ip) in enumerate(pairs):
            srv = fabric.host(hosts[server_ip]).popen(
                ["iperf3", "-s", "-1", "-B", server_ip, "-p", str(5201 + i)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            fabric.record.add_pid(srv.pid, "test iperf3 server")
            servers.append(srv)
        time.sleep(0.5)
        before = telemetry.snapshot(ports)
        for i, (client, src_ip, server_ip) in enumerate(pairs):
            cli = fabric.host(client).popen(
                ["iperf3", "-c", server_ip, "-B", src_ip, "-p", str(5201 + i), "-t",
                 str(SECONDS), "-J", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True)
            fabric.record.add_pid(cli.pid, "test iperf3 client")
            clients.append(cli)
        reports = []
        for cli in clients:
            out, err = cli.communicate(timeout=SECONDS + 20)
            assert cli.returncode == 0, err
            reports.append(json.loads(out))
        after = telemetry.drained_snapshot(ports)
        for srv in servers:
            srv.wait(timeout=10)
    finally:
        for proc in servers + clients:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return reports, before, after


def test_management_lan_is_separate_slow_and_counted() -> None:
    env = environment.detect()
    runtime = environment.pick_runtime(env.runtimes, None)
    topo = make_topology({"type": "leafspine", "spines": 2, "leaves": 3, "hosts_per_leaf": 1,
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

        ip = {h["name"]: str(h["ip"]) for h in fabric.desc["mgmt"]["hosts"]}
        fabric_ports = telemetry.fabric_ports(fabric.desc)
        mgmt_ports = telemetry.mgmt_ports(fabric.desc)
        assert {p.role for p in mgmt_ports} == {"mgmt"}
        to_h2 = next(p for p in mgmt_ports if p.peer == "h2")
        ports = fabric_ports + mgmt_ports
        (tcp,), before, after = iperf(fabric, [("h1", ip["h1"], ip["h2"])], ports,
                                      "-C", "cubic")
        # Two UDP senders into h2 at 1.6x its management link: the switch port drops.
        udp, u0, u1 = iperf(fabric, [("h1", ip["h1"], ip["h2"]), ("h3", ip["h3"], ip["h2"])],
                            ports, "-u", "-b", f"{UDP_MBPS:g}M", "-l", str(UDP_BYTES))

    received = tcp["end"]["sum_received"]
    mbps = received["bits_per_second"] / 1e6
    payload = received["bytes"]
    counted = after[to_h2].tx_bytes - before[to_h2].tx_bytes
    on_fabric = {p.intf: after[p].tx_bytes - before[p].tx_bytes for p in fabric_ports}
    lost = sum(r["end"]["sum"]["lost_packets"] for r in udp)
    dropped = (u1[to_h2].qdisc_drops - u0[to_h2].qdisc_drops
               + u1[to_h2].tx_dropped - u0[to_h2].tx_dropped)
    udp_fabric = sum(u1[p].tx_bytes - u0[p].tx_bytes for p in fabric_ports)
    print(f"mgmt TCP {mbps:.2f} Mbit/s; {payload} B payload, {counted} B counted on "
          f"{to_h2.intf} ({counted / payload:.4f}); fabric ports {on_fabric}; UDP: iperf3 "
          f"lost {lost} datagrams, {to_h2.intf} dropped {dropped}; fabric {udp_fabric} B")
    assert RATE_LO <= mbps <= RATE_HI, mbps
    assert mbps < HOST_BW / 2
    assert COUNT_LO <= counted / payload <= COUNT_HI, (counted, payload)
    assert sum(on_fabric.values()) <= FABRIC_SLACK_BYTES, on_fabric
    assert lost > 0
    assert abs(dropped - lost) <= DROP_SLACK, (dropped, lost)
    assert udp_fabric <= FABRIC_SLACK_BYTES
