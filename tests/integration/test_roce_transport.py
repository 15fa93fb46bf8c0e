"""The RoCEv2 transport (``lab/agents/roce``, the ``roce_bw`` program) on real packets.

Rig: three namespaces of our own, A (client) - S (switch) - B (server), joined by veths; S's
port towards B is shaped exactly like a lab switch port (htb + bfifo at 50 Mbit/s, with the
lab's wire size table, so its byte counter counts what the program calls wire bytes). The
tests check that what the program says it sent is what the port carried and the server
accepted, that tshark reads the packets as InfiniBand over UDP 4791, that RC recovers every
message from random loss (nftables on S), and that CE marks (nftables on S) bring CNPs at
the notification point's pace and DCQCN's cuts at the sender. Run with ``pytest -s`` to see
the numbers.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from controllers import cbuild
from lab.agents import roce
from lab.net.links import tc_commands
from lab.net.wire import Qdisc, count_wire_bytes
from tests.integration.nsrig import LineRig
from tests.unit.test_roce_wire import icrc_by_zlib

RATE_MBIT = 50
QUEUE_BYTES = 150_000
SIZE = 65_536
MTU = 1024
#: Bytes of one full data packet on the wire: IPv4 20, UDP 8, BTH 12, payload, ICRC 4, and
#: the Ethernet header, FCS, preamble and gap (38) the port's size table adds.
FULL_WIRE = 20 + 8 + 12 + MTU + 4 + 38
#: Goodput a 50 Mbit/s port allows: the payload share of Middle packets (First carries 16
#: bytes of RETH more, a rounding error at 64 packets a message).
CEILING_MBPS = RATE_MBIT * MTU / FULL_WIRE
#: Extra bytes the shaped port may carry besides the data packets: S's ARP for B.
TC_SLACK_BYTES = 1_000
#: One CNP per QP per interval: dcqcn_default_params scales the paper's 50 us by 40e9/rate.
CNP_INTERVAL_S = 50e-6 * 40e9 / (RATE_MBIT * 1e6)

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root: network namespaces, tc, nftables")


@dataclass(kw_only=True)
class Rig(LineRig):
    """Client A, switch S, server B (``nsrig.NsRig``, subnet 10.78): S's port towards B is
    the lab-shaped one."""

    family: str = "rce"
    subnet: str = "10.78"
    program: Path = Path()

    def start(self) -> None:
        super().start()
        for cmd in tc_commands(self.if_sb, RATE_MBIT, QUEUE_BYTES):
            self.ns(self.ns_s, *cmd.split())
        count_wire_bytes(self.sleepers["s"], [Qdisc(self.if_sb)])
        self.ns(self.ns_a, "ping", "-c", "1", "-W", "2", self.ip_b)   # ARP settled

    def port_counters(self) -> tuple[int, int]:
        """(bytes, packets) the shaped port towards B has sent, in wire bytes."""
        root = next(q for q in self.tc_json(self.ns_s, self.if_sb, "qdisc") if q.get("root"))
        return root["bytes"], root["packets"]

    def nft(self, script: str) -> None:
        """Load an nftables script in S (one table of ours, removed by ``nft_delete``)."""
        r = subprocess.run(["nsenter", f"--net=/run/netns/{self.name(self.ns_s)}", "nft",
                            "-f", "-"],
                           input=script, capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            raise RuntimeError(f"nft: {r.stderr.strip()}")

    def nft_delete(self, family: str, table: str) -> None:
        self.ns(self.ns_s, "nft", "delete", "table", family, table)

    def nft_counters(self, family: str, table: str) -> list[int]:
        """The packet counts of the table's counters, in rule order."""
        out = json.loads(self.ns(self.ns_s, "nft", "-j", "list", "table", family,
                                 table).stdout)
        return [e["counter"]["packets"] for item in out["nftables"]
                for e in item.get("rule", {}).get("expr", []) if "counter" in e]

    def run(self, tmp: Path, *client_args: str, stop_after: float | None = None,
            server_args: tuple[str, ...] = ()) -> tuple[dict, dict, int]:
        """One server + one client run: (client JSON, server JSON, client exit code). With
        ``stop_after`` the client is stopped by SIGTERM that many seconds in."""
        srv_out, cli_out = tmp / "server.json", tmp / "client.json"
        server = self.spawn(self.ns_b, str(self.program), "--server", "--rate-mbps",
                            str(RATE_MBIT), "--out", str(srv_out), *server_args,
                            stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while ":4791 " not in self.ns(self.ns_b, "ss", "-Hlun").stdout:
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            assert time.monotonic() < deadline, "the server did not bind UDP 4791"
            time.sleep(0.05)
        client = self.spawn(self.ns_a, str(self.program), "--client", self.ip_b,
                            "--rate-mbps", str(RATE_MBIT), "--out", str(cli_out),
                            *client_args, stderr=subprocess.PIPE, text=True)
        try:
            client.wait(timeout=stop_after or 30)
        except subprocess.TimeoutExpired:
            assert stop_after is not None, "the client did not finish within 30 s"
            os.kill(client.pid, signal.SIGTERM)
            client.wait(timeout=10)
        time.sleep(0.2)   # the last ACKs' round trip
        os.kill(server.pid, signal.SIGTERM)
        server.wait(timeout=10)
        err = client.stderr.read() if client.stderr else ""
        assert server.returncode == 0, server.stderr.read() if server.stderr else ""
        assert cli_out.is_file(), f"client wrote no JSON (exit {client.returncode}): {err}"
        return json.loads(cli_out.read_text()), json.loads(srv_out.read_text()), \
            client.returncode


class Capture:
    """tcpdump on one of S's ports, started and stopped by PID."""

    def __init__(self, rig: Rig, intf: str, path: Path, count: int, bpf: str) -> None:
        self.path = path
        self.proc = rig.capture(rig.ns_s, intf, path, "-c", str(count), bpf)

    def stop(self) -> None:
        Rig.stop(self.proc)


def tshark_fields(pcap: Path, *fields: str) -> list[list[str]]:
    """One row per frame of ``tshark -T fields``, with tshark's own defaults: Wireshark 4.0
    registers its InfiniBand dissector on UDP 4791 (RRoCE) by itself, so no ``-d``."""
    argv = ["tshark", "-n", "-r", str(pcap), "-T", "fields"]
    for f in fields:
        argv += ["-e", f]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [line.split("\t") for line in r.stdout.splitlines()]


def pcap_ip_packets(pcap: Path) -> list[bytes]:
    """The IPv4 packets of an Ethernet pcap (tcpdump's classic format), read by hand."""
    data = pcap.read_bytes()
    assert struct.unpack_from("<I", data)[0] == 0xA1B2C3D4, "not a little-endian pcap"
    packets, off = [], 24
    while off + 16 <= len(data):
        incl = struct.unpack_from("<IIII", data, off)[2]
        frame = data[off + 16:off + 16 + incl]
        off += 16 + incl
        if frame[12:14] == b"\x08\x00":
            packets.append(frame[14:])
    return packets


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """roce_bw built as the lab builds it (``lab.agents.roce.ROCE_BW``)."""
    return cbuild.build("roce_bw", roce.ROCE_BW,
                        build_dir=tmp_path_factory.mktemp("roce-build"))


@pytest.fixture(scope="module")
def rig(program: Path) -> Iterator[Rig]:
    r = Rig(program=program)
    try:
        r.start()
        yield r
    finally:
        r.close()


BASE_ARGS = ("--qps", "2", "--size", str(SIZE), "--tx-depth", "8", "--mtu", str(MTU))


@pytest.fixture(scope="module")
def clean_run(rig: Rig, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """(1) 2 s, no loss, no marking, no congestion control: the baseline."""
    before = rig.port_counters()
    client, server, code = rig.run(tmp_path_factory.mktemp("clean"), *BASE_ARGS,
                                   "--duration", "2", "--cc", "none")
    after = rig.port_counters()
    port = {"bytes": after[0] - before[0], "packets": after[1] - before[1]}
    print(f"\n(1) clean: goodput {client['goodput_mbps']} Mbit/s, {client['totals']}"
          f"\n    server {server['totals']}\n    port {port}, cpu client {client['cpu']}"
          f" server {server['cpu']}")
    return {"client": client, "server": server, "code": code, "port": port}


def test_bytes_agree_with_the_receiver_and_the_shaped_port(clean_run: dict) -> None:
    """What the client says it sent is what the server accepted and the port carried."""
    client, server, port = clean_run["client"], clean_run["server"], clean_run["port"]
    assert clean_run["code"] == 0 and client["error"] is None, client["error"]
    sent, got = client["totals"], server["totals"]
    assert sent["retransmitted_packets"] == 0 and sent["naks_received"] == 0, sent
    assert got["payload_bytes_received"] == sent["payload_bytes_sent"] > 0
    assert got["wire_bytes_received"] == sent["wire_bytes_sent"]
    assert got["packets_received"] == sent["packets_sent"]
    by_qpn = {q["qpn"]: q for q in server["qps"]}
    assert len(by_qpn) == 2
    for q in client["qps"]:
        peer = by_qpn[q["dqpn"]]
        assert peer["peer_qpn"] == q["qpn"]
        assert q["messages_completed"] == q["messages_posted"] == peer["messages_received"]
        assert peer["payload_bytes_received"] == q["messages_completed"] * SIZE
        assert q["latency_us"]["p50"] <= q["latency_us"]["p99"] <= q["latency_us"]["max"]
    # The port counts every frame's wire bytes: ours exactly, plus S's own ARP at most.
    assert 0 <= port["bytes"] - sent["wire_bytes_sent"] <= TC_SLACK_BYTES, port
    assert 0 <= port["packets"] - sent["packets_sent"] <= 4, port


def test_the_pacer_holds_the_line_rate(clean_run: dict) -> None:
    """--rate-mbps paces at the wire rate: goodput near, and not above, what the port's
    50 Mbit/s carries of payload (the two QPs share it evenly)."""
    client = clean_run["client"]
    assert 0.85 * CEILING_MBPS < client["goodput_mbps"] <= 1.01 * CEILING_MBPS, client
    sent = [q["payload_bytes_sent"] for q in client["qps"]]
    assert min(sent) > 0.9 * max(sent), sent


def test_tshark_decodes_infiniband_over_udp_4791(rig: Rig, tmp_path: Path) -> None:
    """(2) A few hundred captured packets: tshark names the protocol, opcodes and PSNs we
    sent (through a PSN wrap), and each ICRC matches zlib over the masked bytes."""
    pcap = tmp_path / "roce.pcap"
    start_psn = (1 << 24) - 100
    cap = Capture(rig, rig.if_sb, pcap, 300, "udp port 4791")
    try:
        client, server, code = rig.run(tmp_path, "--qps", "1", "--size", str(SIZE),
                                       "--tx-depth", "4", "--iters", "8", "--cc", "none",
                                       "--psn", str(start_psn))
    finally:
        cap.stop()
    assert code == 0, client["error"]
    rows = tshark_fields(pcap, "frame.protocols", "udp.dstport", "ip.dsfield.dscp",
                         "ip.dsfield.ecn", "infiniband.bth.opcode", "infiniband.bth.psn",
                         "infiniband.bth.destqp", "infiniband.bth.a",
                         "infiniband.aeth.syndrome")
    assert len(rows) == 300, len(rows)
    qp = client["qps"][0]
    data = [r for r in rows if r[4] in ("6", "7", "8")]
    acks = [r for r in rows if r[4] == "17"]
    print(f"\n(2) tshark: {rows[0]}\n    an ACK: {acks[0] if acks else None}")
    assert all(r[0].startswith("eth:ethertype:ip:udp:infiniband") for r in data), rows[0]
    assert all(r[1] == "4791" for r in rows)
    assert all((r[2], r[3]) == ("26", "2") for r in data)     # DSCP 26, ECT(0)
    assert all(int(r[6], 16) == qp["dqpn"] for r in data)
    psns = [int(r[5]) for r in data]
    assert psns == [(start_psn + i) % (1 << 24) for i in range(len(psns))]  # wraps to 0
    opcodes = [int(r[4]) for r in data]
    assert opcodes[:SIZE // MTU] == [6] + [7] * (SIZE // MTU - 2) + [8]
    assert [r[7] for r in data[:SIZE // MTU]] == ["0"] * (SIZE // MTU - 1) + ["1"]
    assert acks and all(int(r[8]) == 0x1F and int(r[6], 16) == qp["qpn"] for r in acks)
    packets = [p for p in pcap_ip_packets(pcap) if p[9] == 17]
    assert packets and all(p[-4:] == icrc_by_zlib(p) for p in packets)
    assert server["totals"]["messages_received"] == 8


def test_random_loss_is_recovered_by_go_back_n(rig: Rig, clean_run: dict,
                                               tmp_path: Path) -> None:
    """(3) ~1 % of the RoCE packets dropped on S, both ways: NAKs, retransmissions (and
    timeouts where a NAK or the last ACK was lost), every message completes, each byte is
    accepted once, and goodput falls below the clean run's."""
    table = f"rce_loss_{os.getpid()}"
    rig.nft(f"""table ip {table} {{
        chain loss {{
            type filter hook forward priority 0; policy accept;
            ip daddr {rig.ip_b} udp dport 4791 numgen random mod 100 < 1 counter drop
            ip daddr {rig.ip_a} udp dport 4791 numgen random mod 100 < 1 counter drop
        }}
    }}""")
    try:
        client, server, code = rig.run(tmp_path, *BASE_ARGS, "--duration", "2", "--cc",
                                       "none")
        dropped = rig.nft_counters("ip", table)
    finally:
        rig.nft_delete("ip", table)
    sent, got = client["totals"], server["totals"]
    print(f"\n(3) loss: dropped {dropped}; goodput {client['goodput_mbps']} Mbit/s "
          f"(clean {clean_run['client']['goodput_mbps']}); {sent}\n    server {got}")
    assert code == 0 and client["error"] is None, client["error"]
    assert dropped[0] > 0
    assert got["naks_sent"] > 0 and sent["naks_received"] > 0
    assert sent["retransmitted_packets"] >= dropped[0]
    for q in client["qps"]:
        assert q["messages_completed"] == q["messages_posted"] > 0, q
    assert got["payload_bytes_received"] == sent["messages_completed"] * SIZE
    assert client["goodput_mbps"] < clean_run["client"]["goodput_mbps"]


def test_a_host_queue_that_refuses_loses_nothing(rig: Rig, tmp_path: Path) -> None:
    """A's own port at 20 Mbit/s with a 3 kB FIFO, less than the raw socket may have queued
    below it, and the client paced at 50: the FIFO refuses packets on entry; the program
    keeps each and sends it again (a NIC loses nothing it could not queue), so there is no
    NAK, no timeout and nothing sent twice, and the port's rate is the goodput's. The
    timer is 50 ms, not 4: a packet refused waits in the program as long as the FIFO and
    the batch take to drain (a few ms at 20 Mbit/s, more on a busy machine), and a
    spurious timeout is not what this test is about."""
    dev, iters = rig.dev("a", "s"), 40
    for cmd in tc_commands(dev, 20, 3000):
        rig.ns(rig.ns_a, *cmd.split())
    try:
        client, server, code = rig.run(tmp_path, *BASE_ARGS, "--iters", str(iters),
                                       "--cc", "none", "--rto-ms", "50")
    finally:
        rig.ns(rig.ns_a, "tc", "qdisc", "del", "dev", dev, "root")
    sent = client["totals"]
    print(f"\nrefused {client['tx_refused']} times; goodput {client['goodput_mbps']} Mbit/s;"
          f" {sent}")
    assert code == 0 and client["error"] is None, client["error"]
    assert client["tx_refused"] > 0
    assert sent["naks_received"] == sent["rto_events"] == sent["retransmitted_packets"] == 0
    assert server["totals"]["payload_bytes_received"] == 2 * iters * SIZE   # 2 QPs
    assert client["goodput_mbps"] > 0.8 * 20 * MTU / FULL_WIRE


def test_ce_marks_bring_paced_cnps_and_dcqcn_cuts(rig: Rig, tmp_path: Path) -> None:
    """(4) Every RoCE data packet marked CE on S's port towards B: the server sends at most
    one CNP per QP per interval (DSCP 48, not ECN-capable, tshark: opcode 0x81), and with
    --cc dcqcn the client's rate falls below the line rate."""
    table = f"rce_ce_{os.getpid()}"
    rig.nft(f"""table netdev {table} {{
        chain egress {{
            type filter hook egress device {rig.if_sb} priority 0;
            ip daddr {rig.ip_b} udp dport 4791 ip ecn set ce counter
        }}
    }}""")
    pcap = tmp_path / "cnp.pcap"
    cap = Capture(rig, rig.if_sa, pcap, 5, "udp port 4791 and ip[1] = 0xc0")
    try:
        client, server, _ = rig.run(tmp_path, *BASE_ARGS, "--duration", "10", "--cc",
                                    "dcqcn", stop_after=3)
        marked = rig.nft_counters("netdev", table)
    finally:
        cap.stop()
        rig.nft_delete("netdev", table)
    print(f"\n(4) CE: marked {marked}; client {client['totals']}\n    server "
          f"{server['totals']}\n    dcqcn {[q['dcqcn'] for q in client['qps']]}")
    assert client["stopped_by_signal"] and client["error"] is None
    assert marked[0] > 0
    assert server["config"]["cnp_interval_us"] == pytest.approx(CNP_INTERVAL_S * 1e6)
    for peer in server["qps"]:
        span = peer["last_s"] - peer["first_s"]
        assert peer["ce_received"] == peer["packets_received"] > 0
        assert 0 < peer["cnps_sent"] <= span / CNP_INTERVAL_S + 1, peer
    # A CNP for the last packets may reach the client after it wrote its JSON.
    cnps_sent, cnps_received = server["totals"]["cnps_sent"], client["totals"]["cnps_received"]
    assert 0 < cnps_received <= cnps_sent <= cnps_received + len(client["qps"])
    for q in client["qps"]:
        rates = [s[1] for s in q["rate_samples"]]
        assert q["dcqcn"]["cuts"] > 0 and min(rates) < 0.5 * RATE_MBIT * 1e6, q["dcqcn"]
    rows = tshark_fields(pcap, "ip.dsfield.dscp", "ip.dsfield.ecn", "infiniband.bth.opcode",
                         "infiniband.bth.destqp")
    qpns = {q["qpn"] for q in client["qps"]}
    assert rows and all(r[:3] == ["48", "0", "129"] and int(r[3], 16) in qpns for r in rows)


def test_without_a_responder_the_qp_fails_after_its_retries(rig: Rig, tmp_path: Path) -> None:
    """No server in B: nothing is ever acknowledged, so the retransmission timer fires
    retry-cnt + 1 times, the QP goes to the error state and the program exits non-zero,
    saying why on one line and in its JSON."""
    out = tmp_path / "client.json"
    r = rig.ns(rig.ns_a, str(rig.program), "--client", rig.ip_b, "--iters", "1", "--size",
               str(SIZE), "--rto-ms", "5", "--retry-cnt", "3", "--cc", "none", "--rate-mbps",
               str(RATE_MBIT), "--out", str(out), check=False)
    client = json.loads(out.read_text())
    print(f"\n(5) no responder: exit {r.returncode}, {r.stderr.strip()}")
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "retry count exceeded" in r.stderr
    qp = client["qps"][0]
    assert qp["state"] == "ERROR" and "retry count exceeded" in client["error"]
    assert qp["rto_events"] == 4 and qp["messages_completed"] == 0
    assert qp["retransmitted_packets"] == 3 * SIZE // MTU
