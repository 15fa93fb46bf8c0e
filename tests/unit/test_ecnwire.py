"""ecnwire: ECN codepoints and TCP ECN flags counted from hand-made captures, overall and per
flow, and tcpdump's start/stop protocol against a stand-in tcpdump (no root, no network)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import ARP, Dot1Q, Ether
from scapy.packet import Raw
from scapy.utils import PcapWriter, wrpcap

from lab.measure import ecnwire

A, B, C = "10.0.0.1", "10.0.0.2", "10.0.0.3"
NOT_ECT, ECT1, ECT0, CE = 0, 1, 2, 3


def tcp(src: str, dst: str, sport: int, dport: int, flags: str, tos: int = 0,
        payload: int = 0) -> Any:
    return (Ether() / IP(src=src, dst=dst, tos=tos) / TCP(sport=sport, dport=dport, flags=flags)
            / Raw(bytes(payload)))


def udp(src: str, dst: str, sport: int, dport: int, tos: int = 0, payload: int = 100) -> Any:
    return Ether() / IP(src=src, dst=dst, tos=tos) / UDP(sport=sport, dport=dport) \
        / Raw(bytes(payload))


def ip_len(pkt: Any) -> int:
    return len(pkt[IP])


#: An ECN TCP connection A:40000 -> B:5201 and its ACKs, as a receiver's capture shows it.
HANDSHAKE = [
    tcp(A, B, 40000, 5201, "SEC"),                 # ECN-setup SYN: ECE+CWR
    tcp(B, A, 5201, 40000, "SAE"),                 # ECN-setup SYN-ACK: ECE only
    tcp(A, B, 40000, 5201, "A"),
]
DATA = [
    tcp(A, B, 40000, 5201, "PA", ECT0, 1000),
    tcp(A, B, 40000, 5201, "PA", CE, 1000),        # marked by a queue
    tcp(A, B, 40000, 5201, "PA", CE, 1000),
    tcp(B, A, 5201, 40000, "AE"),                  # receiver echoes the mark
    tcp(B, A, 5201, 40000, "AE"),
    tcp(A, B, 40000, 5201, "PAC", ECT0, 1000),     # sender reduced its window
    tcp(B, A, 5201, 40000, "A"),
]
#: A non-ECN TCP connection C -> B (negotiation refused: SYN-ACK without ECE).
OTHER_TCP = [
    tcp(C, B, 40001, 5201, "SEC"),
    tcp(B, C, 5201, 40001, "SA"),
    tcp(C, B, 40001, 5201, "PA", NOT_ECT, 500),
]
UDP_PKTS = [udp(A, B, 9000, 9000, ECT1), udp(A, B, 9000, 9000, CE), udp(C, B, 7, 7)]
NON_IP = [Ether() / ARP(psrc=A, pdst=B)]

ECN_FLOW = {"src_ip": A, "dst_ip": B, "proto": "tcp", "sport": 40000, "dport": 5201}


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    path = tmp_path / "c.pcap"
    wrpcap(str(path), HANDSHAKE + DATA + OTHER_TCP + UDP_PKTS + NON_IP)
    return path


def test_overall_counts(capture: Path) -> None:
    s = ecnwire.summarize(capture)
    ip_pkts = HANDSHAKE + DATA + OTHER_TCP + UDP_PKTS
    assert s["packets"] == len(ip_pkts) + 1
    assert s["ipv4"] == len(ip_pkts)
    assert s["other"] == 1
    assert s["ecn"] == {"not_ect": 10, "ect0": 2, "ect1": 1, "ce": 3}
    assert s["ce_bytes"] == 2 * ip_len(DATA[1]) + ip_len(UDP_PKTS[1])
    assert s["ecn_bytes"]["ce"] == s["ce_bytes"]
    assert s["bytes"] == sum(ip_len(p) for p in ip_pkts)
    assert s["tcp"] == {"segments": 13, "syn": 2, "synack": 2, "ecn_syn": 2, "ecn_synack": 1,
                        "ece": 2, "cwr": 1}
    assert s["udp"] == 3
    assert s["udp_bytes"] == sum(ip_len(p) for p in UDP_PKTS)
    assert s["flows"] == {}


def test_flow_directions(capture: Path) -> None:
    """The data direction carries CE and CWR, the reverse carries ECE: a flow's report must
    keep them apart, and count nothing of other flows."""
    s = ecnwire.summarize(capture, [ECN_FLOW])
    f = s["flows"]["10.0.0.1:40000->10.0.0.2:5201/tcp"]
    assert f["flow"] == ECN_FLOW
    fw, rv = f["forward"], f["reverse"]
    assert fw["packets"] == 6 and rv["packets"] == 4
    assert fw["ecn"] == {"not_ect": 2, "ect0": 2, "ect1": 0, "ce": 2}
    assert fw["tcp"]["ecn_syn"] == 1 and fw["tcp"]["cwr"] == 1 and fw["tcp"]["ece"] == 0
    assert rv["tcp"]["ecn_synack"] == 1 and rv["tcp"]["ece"] == 2 and rv["tcp"]["cwr"] == 0
    assert rv["ecn"]["ce"] == 0
    assert fw["ce_bytes"] == 2 * ip_len(DATA[1])
    assert fw["udp"] == rv["udp"] == 0


def test_flow_ids_wildcards_and_udp(capture: Path) -> None:
    flows = [
        {"id": "any-to-5201", "dst_ip": B, "proto": "tcp", "dport": 5201},   # sport: any
        {"id": "udp", "src_ip": A, "dst_ip": B, "proto": 17, "sport": 9000, "dport": 9000},
        {"id": "nothing", "src_ip": A, "dst_ip": C, "proto": "tcp", "sport": 1, "dport": 2},
    ]
    s = ecnwire.summarize(capture, flows)
    wild = s["flows"]["any-to-5201"]
    assert wild["forward"]["packets"] == 6 + 2              # both connections' client side
    assert wild["forward"]["tcp"]["ecn_syn"] == 2
    assert wild["reverse"]["tcp"]["synack"] == 2
    assert wild["reverse"]["tcp"]["ecn_synack"] == 1         # only one side agreed to ECN
    u = s["flows"]["udp"]
    assert u["forward"]["udp"] == 2 and u["reverse"]["packets"] == 0
    assert u["forward"]["ecn"] == {"not_ect": 0, "ect0": 0, "ect1": 1, "ce": 1}
    assert s["flows"]["nothing"]["forward"]["packets"] == 0


def test_flow_key_without_id() -> None:
    assert ecnwire.flow_key({"src_ip": A, "dst_ip": B, "proto": "udp", "dport": 53}) \
        == "10.0.0.1:*->10.0.0.2:53/udp"


def test_unknown_proto_is_an_error(capture: Path) -> None:
    with pytest.raises(ValueError, match="sctp"):
        ecnwire.summarize(capture, [{"src_ip": A, "dst_ip": B, "proto": "sctp"}])


def test_truncated_vlan_and_fragments(tmp_path: Path) -> None:
    """A snaplen-truncated record still counts the packet's full IP length; a VLAN tag is
    skipped; a non-first fragment has no ports or flags to read."""
    big = tcp(A, B, 40000, 5201, "PA", CE, 1400)
    tagged = Ether() / Dot1Q(vlan=10) / IP(src=A, dst=B, tos=ECT0) / UDP(sport=1, dport=2)
    frag = Ether() / IP(src=A, dst=B, tos=CE, proto=17, frag=100) / Raw(bytes(64))
    path = tmp_path / "t.pcap"
    with PcapWriter(str(path), linktype=1) as w:
        w.write(bytes(big)[:80])                  # what tcpdump -s 80 would have kept
        w.write(tagged)
        w.write(frag)
    s = ecnwire.summarize(path, [ECN_FLOW])
    assert s["ipv4"] == 3
    assert s["ce_bytes"] == ip_len(big) + ip_len(frag)
    assert s["ecn"]["ect0"] == 1
    assert s["udp"] == 1                          # the tagged one; the fragment has no header
    assert s["tcp"]["segments"] == 1
    assert s["flows"]["10.0.0.1:40000->10.0.0.2:5201/tcp"]["forward"]["ce_bytes"] == \
        ip_len(big)


def test_raw_ip_linktype(tmp_path: Path) -> None:
    """Captures on tun devices or "any" have no Ethernet header."""
    path = tmp_path / "raw.pcap"
    wrpcap(str(path), [IP(src=A, dst=B, tos=CE) / UDP(sport=1, dport=2)], linktype=101)
    s = ecnwire.summarize(path)
    assert s["ecn"]["ce"] == 1 and s["udp"] == 1


def test_microburst_frames_are_read(tmp_path: Path) -> None:
    """The burst tool's frames, as a capture at the receiver would store them."""
    from lab.agents import microburst
    template = microburst.build_template("02:00:00:00:00:01", "02:00:00:00:00:02", A, B,
                                         9000, 9001, 1000, "ect0")
    frames = microburst.burst_frames(template, 3, 10)
    path = tmp_path / "mb.pcap"
    with PcapWriter(str(path), linktype=1) as w:
        for f in frames:
            w.write(f)
    s = ecnwire.summarize(path, [{"id": "mb", "src_ip": A, "dst_ip": B, "proto": "udp",
                                  "sport": 9000, "dport": 9001}])
    fw = s["flows"]["mb"]["forward"]
    assert fw["udp"] == 10 and fw["ecn"]["ect0"] == 10
    assert fw["udp_bytes"] == 10 * (1000 + 28)
    assert [int.from_bytes(f[50:54], "big") for f in frames] == list(range(10))


def test_summarize_counts_a_large_capture(tmp_path: Path) -> None:
    """50k packets (23 MB): every one counted, overall and in its flow's directions, across
    however many reads the file takes. How fast: bench/ecnwire.py."""
    path = tmp_path / "big.pcap"
    cycle = HANDSHAKE + DATA
    raw = [bytes(p) for p in cycle]
    with PcapWriter(str(path), linktype=1) as w:
        for i in range(50_000):
            w.write(raw[i % len(raw)])
    s = ecnwire.summarize(path, [ECN_FLOW])
    reps = 50_000 // len(cycle)
    assert s["packets"] == s["ipv4"] == 50_000
    assert s["ecn"]["ce"] == 2 * reps and s["tcp"]["ecn_syn"] == reps
    f = s["flows"]["10.0.0.1:40000->10.0.0.2:5201/tcp"]
    assert (f["forward"]["packets"], f["reverse"]["packets"]) == (6 * reps, 4 * reps)
    assert f["forward"]["tcp"]["cwr"] == reps and f["reverse"]["tcp"]["ece"] == 2 * reps


# --------------------------------------------------------------------------------------------
# start_capture / stop against a stand-in tcpdump

FAKE_TCPDUMP = textwrap.dedent("""
    import signal, sys, time
    def stop(*_):
        sys.stderr.write("5 packets captured\\n7 packets received by filter\\n"
                         "1 packet dropped by kernel\\n")
        sys.exit(0)
    signal.signal(signal.SIGINT, stop)
    time.sleep(0.3)                       # the caller must wait for the line below
    sys.stderr.write("tcpdump: listening on %s, link-type EN10MB\\n" % sys.argv[2])
    sys.stderr.flush()
    time.sleep(30)
""")


#: How long a stand-in may take to say it listens (or fails): a hang guard, not a bound. It
#: needs an interpreter's start and 0.3 s; START_TIMEOUT_S (10 s) is sized for real tcpdumps.
HANG_S = 60.0


def fake_popen(script: str, calls: list[list[str]]) -> ecnwire.Popen:
    def popen(argv: list[str], **kw: Any) -> subprocess.Popen:
        calls.append(argv)
        return subprocess.Popen([sys.executable, "-c", script, *argv[1:]], **kw)
    return popen


def test_start_waits_for_listening_and_stop_reads_counters(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    cap = ecnwire.start_capture(fake_popen(FAKE_TCPDUMP, calls), "eth9", tmp_path / "x.pcap",
                                snaplen=96, timeout_s=HANG_S)
    assert b"listening on eth9" in cap.stderr
    assert cap.proc.poll() is None and cap.pid == cap.proc.pid
    argv = calls[0]
    assert argv[0] == "tcpdump" and argv[argv.index("-i") + 1] == "eth9"
    assert argv[argv.index("-s") + 1] == "96" and argv[-1] == "ip"
    assert "-U" in argv and str(tmp_path / "x.pcap") in argv
    assert cap.stop() == {"captured": 5, "received_by_filter": 7, "dropped_by_kernel": 1}


def test_start_reports_a_failing_tcpdump(tmp_path: Path) -> None:
    script = "import sys; sys.stderr.write('tcpdump: nope0: No such device exists\\n'); " \
             "sys.exit(1)"
    with pytest.raises(ecnwire.CaptureError, match="No such device"):
        ecnwire.start_capture(fake_popen(script, []), "nope0", tmp_path / "x.pcap",
                              timeout_s=HANG_S)


def test_start_gives_up_and_kills(tmp_path: Path) -> None:
    procs: list[subprocess.Popen] = []

    def popen(argv: list[str], **kw: Any) -> subprocess.Popen:
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                                      **kw))
        return procs[-1]
    with pytest.raises(ecnwire.CaptureError, match="did not start"):
        ecnwire.start_capture(popen, "eth0", tmp_path / "x.pcap", timeout_s=0.3)
    assert procs[0].poll() is not None


def test_parse_stats_when_killed() -> None:
    assert ecnwire.parse_tcpdump_stats("tcpdump: listening on x\n") == {
        "captured": -1, "received_by_filter": -1, "dropped_by_kernel": -1}
