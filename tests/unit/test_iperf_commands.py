"""What the lab asks of iperf3: TCP paced by the kernel at the flow's rate (no per-ms timer
in the client), UDP at iperf3's own rate; and how a flow's socket is found in /proc."""

from __future__ import annotations

from lab.model.flows import FlowSpec
from lab.workloads.traffic import _iperf_client_cmd, _proc_net_addr


def flow(proto: str) -> FlowSpec:
    return FlowSpec(id="f1", src="h1", dst="h5", src_ip="10.0.0.1", dst_ip="10.0.0.5",
                    proto=proto, sport=40001, dport=5201, rate_bps=22.5e6, cc="cubic")


def _after(cmd: list[str], opt: str) -> str:
    return cmd[cmd.index(opt) + 1]


def test_tcp_is_paced_by_the_kernel_at_the_flow_rate():
    cmd = _iperf_client_cmd(flow("tcp"), 5)
    assert _after(cmd, "--fq-rate") == "22500000"
    assert _after(cmd, "-b") == "0"          # iperf3's 1 ms throttle timer is off
    assert _after(cmd, "-C") == "cubic" and _after(cmd, "--cport") == "40001"


def test_udp_keeps_iperf3s_rate():
    cmd = _iperf_client_cmd(flow("udp"), 5)
    assert _after(cmd, "-b") == "22500000" and "--fq-rate" not in cmd and "-u" in cmd


def test_proc_net_addresses_are_host_order_hex():
    assert _proc_net_addr("10.0.0.1") == "0100000A"
    assert _proc_net_addr("192.168.1.20") == "1401A8C0"
