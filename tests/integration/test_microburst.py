"""Micro-bursts and ECN on real packets: sender, receiver, tc, capture and summarize agree.

The rig is two namespaces joined by a veth, with the lab's link layout on a's side (htb
20 Mbit/s, bfifo of 30000 bytes) and, standing in for the BPF marker, an nftables egress rule
that sets CE. Every name carries this process's PID and the teardown removes exactly those
names (processes by PID first, so the namespaces can really go), even when an assert fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lab.measure import ecnwire

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, tc, nft)")

IP_A, IP_B = "10.99.0.1", "10.99.0.2"
RATE_BPS, BFIFO_LIMIT = 20_000_000, 30_000
UDP_PORT, IPERF_PORT = 9000, 5201
COUNT, SIZE, BURSTS = 100, 1000, 3

#: a's egress: UDP to the burst port with an odd sequence number (payload bytes 8..11, so
#: bit 95 of the payload) and any ECT TCP packet get CE. Odd-only makes the receiver's
#: per-position report checkable; marking all TCP keeps the TCP check short and certain.
NFT_RULES = """
table netdev {table} {{
  chain egress {{
    type filter hook egress device "{dev}" priority 0;
    ip protocol udp udp dport {port} @ih,88,8 & 1 == 1 ip ecn ect0 ip ecn set ce
    ip protocol tcp ip ecn {{ ect0, ect1 }} ip ecn set ce
  }}
}}
"""


@dataclass
class Rig:
    ns_a: str
    ns_b: str
    if_a: str
    if_b: str
    mac_a: str = ""
    mac_b: str = ""
    procs: list[subprocess.Popen] = field(default_factory=list)

    def cmd(self, ns: str, *argv: str, check: bool = True,
            timeout: float = 15) -> subprocess.CompletedProcess:
        r = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} in {ns}: {r.stderr.strip()}")
        return r

    def popen(self, ns: str) -> Callable[..., subprocess.Popen]:
        """A Mininet-like ``host.popen`` for ``ns``; every process is recorded for teardown
        (``ip netns exec`` execs the command, so the PID is the command's own)."""
        def run(argv: list[str], **kw: Any) -> subprocess.Popen:
            proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv], **kw)
            self.procs.append(proc)
            return proc
        return run

    def bfifo_stats(self) -> dict[str, Any]:
        out = self.cmd(self.ns_a, "tc", "-s", "-j", "qdisc", "show", "dev", self.if_a)
        return next(q for q in json.loads(out.stdout) if q["kind"] == "bfifo")


def _mac(rig: Rig, ns: str, dev: str) -> str:
    return json.loads(rig.cmd(ns, "ip", "-j", "link", "show", dev).stdout)[0]["address"]


def _build(rig: Rig) -> None:
    for ns in (rig.ns_a, rig.ns_b):
        subprocess.run(["ip", "netns", "add", ns], check=True, timeout=10)
        # No IPv6: its router solicitations would otherwise share the queue under test.
        rig.cmd(ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1", "net.ipv4.tcp_ecn=1")
        rig.cmd(ns, "ip", "link", "set", "lo", "up")
    subprocess.run(["ip", "link", "add", rig.if_a, "netns", rig.ns_a, "type", "veth", "peer",
                    "name", rig.if_b, "netns", rig.ns_b], check=True, timeout=10)
    for ns, dev, ip in ((rig.ns_a, rig.if_a, IP_A), (rig.ns_b, rig.if_b, IP_B)):
        rig.cmd(ns, "ip", "addr", "add", f"{ip}/24", "dev", dev)
        rig.cmd(ns, "ip", "link", "set", dev, "up")
    x = rig.if_a
    rig.cmd(rig.ns_a, "tc", "qdisc", "add", "dev", x, "root", "handle", "1:", "htb",
            "default", "1")
    rig.cmd(rig.ns_a, "tc", "class", "add", "dev", x, "parent", "1:", "classid", "1:1", "htb",
            "rate", "20mbit", "ceil", "20mbit", "burst", "70000", "cburst", "70000",
            "quantum", "100000")
    rig.cmd(rig.ns_a, "tc", "qdisc", "add", "dev", x, "parent", "1:1", "handle", "10:",
            "bfifo", "limit", str(BFIFO_LIMIT))
    rules = NFT_RULES.format(table=f"mbt{os.getpid()}", dev=x, port=UDP_PORT)
    r = subprocess.run(["ip", "netns", "exec", rig.ns_a, "nft", "-f", "-"], input=rules,
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    rig.mac_a, rig.mac_b = _mac(rig, rig.ns_a, rig.if_a), _mac(rig, rig.ns_b, rig.if_b)


def _teardown(rig: Rig) -> None:
    """Processes by PID, then the two namespaces (which takes the veth, its qdiscs and the
    nft table with them). Each step runs even if an earlier one failed."""
    for proc in rig.procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    for ns in (rig.ns_a, rig.ns_b):
        if Path("/run/netns", ns).exists():
            subprocess.run(["ip", "netns", "del", ns], timeout=10)


@pytest.fixture
def rig() -> Iterator[Rig]:
    pid = os.getpid()
    r = Rig(f"mbt-{pid}-a", f"mbt-{pid}-b", f"mb{pid}a", f"mb{pid}b")
    try:
        _build(r)
        yield r
    finally:
        _teardown(r)
    assert not Path("/run/netns", r.ns_a).exists() and not Path("/run/netns", r.ns_b).exists()


def _microburst(*args: str) -> list[str]:
    return [sys.executable, "-m", "lab.agents.microburst", *args]


def _wait_stderr_line(proc: subprocess.Popen, text: bytes, timeout_s: float = 10) -> None:
    assert proc.stderr is not None
    fd, seen, deadline = proc.stderr.fileno(), b"", time.monotonic() + timeout_s
    while text not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {text!r} from {proc.args}: {seen!r}"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 4096)
            assert chunk, f"{proc.args} exited: {seen!r}"
            seen += chunk


def _wait_queue_empty(rig: Rig, timeout_s: float = 3) -> None:
    deadline = time.monotonic() + timeout_s
    while rig.bfifo_stats()["backlog"] > 0:
        assert time.monotonic() < deadline, "a's queue did not drain"
        time.sleep(0.02)


def _pcap_arrivals(path: Path) -> dict[int, list[tuple[float, int]]]:
    """(capture time, seq) per burst of the burst tool's frames in a capture."""
    from scapy.utils import RawPcapReader
    out: dict[int, list[tuple[float, int]]] = {}
    with RawPcapReader(str(path)) as reader:
        for frame, meta in reader:
            if len(frame) >= 54 and frame[23] == 17 and frame[42:46] == b"MBU1":
                burst, seq = int.from_bytes(frame[46:50], "big"), \
                    int.from_bytes(frame[50:54], "big")
                out.setdefault(burst, []).append((meta.sec + meta.usec / 1e6, seq))
    return out


def test_bursts_drops_and_ce_agree(rig: Rig, tmp_path: Path) -> None:
    recv_out, send_out, pcap = tmp_path / "recv.json", tmp_path / "send.json", tmp_path / "b.pcap"
    receiver = rig.popen(rig.ns_b)(
        _microburst("--recv", "--bind", IP_B, "--port", str(UDP_PORT),
                    "--expect", str(COUNT * BURSTS), "--timeout-s", "15",
                    "--out", str(recv_out)),
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_stderr_line(receiver, b"listening on")
    cap = ecnwire.start_capture(rig.popen(rig.ns_b), rig.if_b, pcap)
    sender = subprocess.run(
        ["ip", "netns", "exec", rig.ns_a, *_microburst(
            "--iface", rig.if_a, "--src-mac", rig.mac_a, "--dst-mac", rig.mac_b,
            "--src-ip", IP_A, "--dst-ip", IP_B, "--sport", str(UDP_PORT),
            "--dport", str(UDP_PORT), "--count", str(COUNT), "--size", str(SIZE),
            "--ecn", "ect0", "--bursts", str(BURSTS), "--gap-s", "0.1",
            "--out", str(send_out))],
        cwd=REPO, capture_output=True, text=True, timeout=20)
    assert sender.returncode == 0, sender.stderr
    _wait_queue_empty(rig)
    time.sleep(0.1)                                 # the last frames reach b's socket
    os.kill(receiver.pid, signal.SIGINT)            # it cannot reach --expect: drops
    assert receiver.wait(timeout=10) == 0
    stats = cap.stop()

    sent, got = json.loads(send_out.read_text()), json.loads(recv_out.read_text())
    drops = rig.bfifo_stats()["drops"]
    summary = ecnwire.summarize(pcap, [{"id": "burst", "src_ip": IP_A, "dst_ip": IP_B,
                                        "proto": "udp", "sport": UDP_PORT,
                                        "dport": UDP_PORT}])
    print(json.dumps({"sender": sent, "drops": drops, "capture": stats,
                      "receiver": {k: v for k, v in got.items() if k != "datagrams"}}))

    # The shape: every burst handed to the kernel at far above the link's 20 Mbit/s...
    assert [b["attempted"] for b in sent["bursts"]] == [COUNT] * BURSTS
    assert sent["frame_bytes"] == SIZE + 42
    assert min(b["offered_bps"] for b in sent["bursts"]) > 10 * RATE_BPS
    # ...so the 30000-byte queue overflowed, and each dropped frame is accounted once: the
    # qdisc's counter, the sender's ENOBUFS, the receiver's missing sequence numbers.
    assert drops > 0
    assert sent["enobufs"] == drops and sent["sent"] == COUNT * BURSTS - drops
    assert got["received"] == COUNT * BURSTS - drops
    assert sum(len(b["missing"]) for b in got["bursts"]) == drops
    assert got["strays"] == 0 and got["socket_drops"] == 0
    assert all(b["duplicates"] == 0 for b in got["bursts"])
    # Tail drops: nothing is lost before htb's 70000-byte allowance and the 30000-byte queue
    # are used up (~95 frames; a few frames of slack for the queue draining meanwhile).
    head = (70_000 + BFIFO_LIMIT) // (SIZE + 42) - 10
    for b in got["bursts"]:
        assert min(b["missing"], default=COUNT) >= head, b["missing"]

    # CE exactly where the nft rule put it (odd positions), as IP_RECVTOS saw it...
    for b in got["bursts"]:
        received_seqs = sorted(set(range(COUNT)) - set(b["missing"]))
        assert b["ce_seqs"] == [s for s in received_seqs if s % 2 == 1]
        assert b["ecn"]["ect0"] == len(received_seqs) - b["ce"]
    # ...and the capture at b agrees with the receiver's socket, packet for packet.
    assert stats["dropped_by_kernel"] == 0 and stats["captured"] == stats["received_by_filter"]
    fw = summary["flows"]["burst"]["forward"]
    assert fw["udp"] == got["received"]
    assert fw["ecn"]["ce"] == got["ce"] > 0
    assert fw["ecn"]["ect0"] == got["ecn"]["ect0"]
    assert fw["ce_bytes"] == got["ce"] * (SIZE + 28)

    # On the wire: the head of each burst left a (htb's 70000-byte burst allowance) far
    # faster than 20 Mbit/s, the rest no faster than the shaper drains the queue.
    arrivals = _pcap_arrivals(pcap)
    assert sorted(arrivals) == list(range(BURSTS))
    for burst, rows in arrivals.items():
        head = rows[:40]
        span = head[-1][0] - head[0][0]
        assert span < 40 * (SIZE + 42) * 8 / RATE_BPS / 5, (burst, span)
        whole = rows[-1][0] - rows[0][0]
        assert whole > 0.5 * BFIFO_LIMIT * 8 / RATE_BPS, (burst, whole)


def _listening(rig: Rig, ns: str, port: int) -> bool:
    out = rig.cmd(ns, "ss", "-Htln", f"sport = :{port}", check=False).stdout
    return bool(out.strip())


def test_tcp_ecn_negotiated_marked_echoed(rig: Rig, tmp_path: Path) -> None:
    allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read_text().split()
    if "cubic" not in allowed:
        pytest.skip("cubic is not an allowed congestion control (make setup allows it)")
    server = rig.popen(rig.ns_b)(["iperf3", "-s", "-1", "-B", IP_B, "-p", str(IPERF_PORT)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 5
    while not _listening(rig, rig.ns_b, IPERF_PORT):
        assert server.poll() is None and time.monotonic() < deadline, "iperf3 -s not up"
        time.sleep(0.05)
    pcap = tmp_path / "tcp.pcap"
    cap = ecnwire.start_capture(rig.popen(rig.ns_b), rig.if_b, pcap)
    client = rig.cmd(rig.ns_a, "iperf3", "-c", IP_B, "-p", str(IPERF_PORT), "-t", "2",
                     "-C", "cubic", "-J", timeout=20)
    stats = cap.stop()
    server.wait(timeout=5)
    port = json.loads(client.stdout)["start"]["connected"][0]["local_port"]
    s = ecnwire.summarize(pcap, [{"id": "data", "src_ip": IP_A, "dst_ip": IP_B, "proto": "tcp",
                                  "sport": port, "dport": IPERF_PORT}])
    print(json.dumps({"capture": stats, "summary": s}))
    fw, rv = s["flows"]["data"]["forward"], s["flows"]["data"]["reverse"]
    assert stats["captured"] == stats["received_by_filter"] and stats["dropped_by_kernel"] == 0
    # Negotiated: an ECN-setup SYN a->b and an ECN-setup SYN-ACK b->a.
    assert fw["tcp"]["ecn_syn"] >= 1 and rv["tcp"]["ecn_synack"] >= 1
    # Marked on the data direction; echoed (ECE) on the ACKs; answered (CWR) by the sender.
    assert fw["ecn"]["ce"] > 0 and rv["ecn"]["ce"] == 0
    assert rv["tcp"]["ece"] > 0 and fw["tcp"]["ece"] == 0
    assert fw["tcp"]["cwr"] > 0 and rv["tcp"]["cwr"] == 0
    assert s["tcp"]["ecn_syn"] >= 2          # iperf3's control connection negotiated too


def test_sender_rejects_bad_arguments(rig: Rig) -> None:
    """One line naming the argument, exit status 2, nothing sent."""
    good = {"--iface": rig.if_a, "--src-mac": rig.mac_a, "--dst-mac": rig.mac_b,
            "--src-ip": IP_A, "--dst-ip": IP_B, "--sport": "9000", "--dport": "9000",
            "--count": "10", "--size": "1000"}
    cases = [
        ({"--size": "1473"}, "--size"),                   # 1473 + 28 > the veth's MTU 1500
        ({"--size": "8"}, "--size"),                      # no room for the header
        ({"--iface": "nosuch0"}, "--iface"),
        ({"--src-mac": "02:00:00:00:00"}, "--src-mac"),
        ({"--dst-ip": "10.99.0.300"}, "--dst-ip"),
        ({"--count": "0"}, "--count"),
        ({"--ecn": "ect2"}, "--ecn"),
        ({"--gap-s": "-1"}, "--gap-s"),
        ({"--count": None}, "--count"),                   # missing
        ({"--expect": "5"}, "--expect"),                  # a receiver option
    ]
    for change, name in cases:
        args = {**good, **change}
        argv = [x for k, v in args.items() if v is not None for x in (k, v)]
        r = rig.cmd(rig.ns_a, *_microburst(*argv), check=False)
        assert r.returncode == 2, (change, r.stderr)
        assert name in r.stderr and r.stderr.count("\n") == 1, (change, r.stderr)
    assert rig.bfifo_stats()["packets"] == 0
    r = subprocess.run(_microburst("--recv", "--bind", IP_B, "--port", "9000"), cwd=REPO,
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 2 and "--expect" in r.stderr and r.stderr.count("\n") == 1
