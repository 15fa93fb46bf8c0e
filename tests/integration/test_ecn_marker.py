"""The tc-bpf ECN marker on real packets: cubic+ECN through a 50 Mbit/s htb/bfifo port.

Rig: two namespaces of our own joined by a veth; the sender's end is shaped exactly like a
switch port of the lab (htb 1:1 + bfifo 10:). Four cubic streams fill the queue; with step
marking at K the senders must back off on CE instead of on drops. Run with ``pytest -s`` to
see the numbers.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from controllers import ecn
from lab.machine.environment import qdisc_available
from lab.net.links import tc_commands
from lab.net.wire import Qdisc, count_wire_bytes
from tests.integration.nsrig import LineRig

RATE_MBIT = 50
QUEUE_BYTES = 150_000
K_BYTES = 30_000
STREAMS = 4
RUN_S = 4
SAMPLE_S = 0.1


@dataclass(kw_only=True)
class Rig(LineRig):
    """Sender A, switch S, receiver B: three namespaces of ours; removes exactly those.

    The shaped port is S's veth towards B, so the queue sits on a forwarding hop as on
    the lab's switches. (Shaping the sender's own veth would not do: a local qdisc drop
    is reported back to TCP, which sends the segment again without a retransmit.)
    """

    family: str = "ecnt"
    subnet: str = "10.77"

    def start(self) -> None:
        super().start()
        for name in (self.ns_a, self.ns_b):
            self.ns(name, "sysctl", "-q", "-w", "net.ipv4.tcp_ecn=1")
        # the lab's port layout, as lab/net/links.py gives every port
        for cmd in tc_commands(self.if_sb, RATE_MBIT, QUEUE_BYTES):
            self.ns(self.ns_s, *cmd.split())
        count_wire_bytes(self.sleepers["s"], [Qdisc(self.if_sb)])
        self.spawn(self.ns_b, "iperf3", "-s", "-B", self.ip_b, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while "5201" not in self.ns(self.ns_b, "ss", "-Hltn").stdout:
            assert time.monotonic() < deadline, "iperf3 server did not start"
            time.sleep(0.05)

    @property
    def port(self) -> ecn.PortQueue:
        return ecn.PortQueue(self.if_sb, RATE_MBIT * 10**6, QUEUE_BYTES)

    def backlog(self) -> int:
        """Bytes queued at the shaped port now (the htb root counts its leaf's)."""
        return next(q["backlog"] for q in self.tc_json(self.ns_s, self.if_sb, "qdisc")
                    if q.get("root"))

    def iperf(self, seconds: int) -> dict:
        """Cubic streams A -> B; the retransmits and mean/max backlog sampled meanwhile."""
        samples: list[int] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(SAMPLE_S):
                samples.append(self.backlog())

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            r = self.ns(self.ns_a, "iperf3", "-c", self.ip_b, "-P", str(STREAMS), "-t",
                        str(seconds), "-C", "cubic", "-J", timeout=seconds + 20)
        finally:
            stop.set()
            sampler.join()
        end = json.loads(r.stdout)["end"]
        return {"retransmits": end["sum_sent"]["retransmits"],
                "mbps": round(end["sum_received"]["bits_per_second"] / 1e6, 1),
                "mean_backlog": round(statistics.mean(samples)) if samples else 0,
                "max_backlog": max(samples, default=0), "samples": len(samples)}


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read_text().split()
    if "cubic" not in allowed:
        pytest.skip("cubic is not allowed in namespaces (run: make setup)")
    r = Rig()
    try:
        r.start()
        yield r
    finally:
        r.close()


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ecn-build")


@pytest.fixture
def marker(rig: Rig, build_dir: Path) -> Iterator[ecn.Marker]:
    m = ecn.make_marker("tc-bpf", build_dir, netns_pid=rig.sleepers["s"])
    try:
        yield m
    finally:
        m.close()
    qdiscs = json.loads(rig.ns(rig.ns_s, "tc", "-j", "qdisc", "show", "dev", rig.if_sb).stdout)
    assert [q["kind"] for q in qdiscs] == ["htb", "bfifo"], "close() left qdiscs behind"


@pytest.fixture(scope="module")
def baseline(rig: Rig) -> dict:
    """(a) No marker: pure tail-drop at the bfifo."""
    result = rig.iperf(RUN_S)
    print(f"\n(a) marker off: {result}")
    return result


def test_without_marking_the_queue_fills_and_drops(baseline: dict) -> None:
    assert baseline["retransmits"] > 0
    assert baseline["mean_backlog"] > QUEUE_BYTES / 3, baseline


def _header_checksum_ok(ip: object) -> bool:
    """The IPv4 header sums to 0xffff (ones' complement) with its checksum included."""
    header = bytes(ip)[: ip.ihl * 4]  # type: ignore[attr-defined]
    total = sum(int.from_bytes(header[i:i + 2], "big") for i in range(0, len(header), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total == 0xFFFF


class Capture:
    """tcpdump at the receiver, started and stopped by PID."""

    def __init__(self, rig: Rig, path: Path) -> None:
        self.path = path
        self.proc = rig.capture(rig.ns_b, rig.if_b, path, "-s", "128")

    def stop(self) -> dict[str, int]:
        Rig.stop(self.proc)
        from scapy.all import IP, TCP, PcapReader  # slow to import: only when needed
        counts = {"ip": 0, "ce": 0, "ce_bad_checksum": 0, "ece": 0, "cwr": 0}
        with PcapReader(str(self.path)) as pcap:
            for pkt in pcap:
                if IP not in pkt:
                    continue
                counts["ip"] += 1
                if (pkt[IP].tos & 0x3) == 0x3:
                    counts["ce"] += 1
                    counts["ce_bad_checksum"] += not _header_checksum_ok(pkt[IP])
                if TCP in pkt and not pkt[TCP].flags.S:  # SYNs carry ECE/CWR to negotiate
                    counts["ece"] += bool(pkt[TCP].flags.E)
                    counts["cwr"] += bool(pkt[TCP].flags.C)
        return counts


def test_step_marking_replaces_drops_by_marks(rig: Rig, marker: ecn.Marker, baseline: dict,
                                              tmp_path: Path) -> None:
    """(b) DCTCP-style step at K: CE on the wire, senders react, the queue stays short."""
    mounts_before = _bpf_mounts()
    marker.set(rig.port, ecn.Marking.step(K_BYTES))
    marker.set(rig.port, ecn.Marking.step(K_BYTES))  # idempotent: still one filter
    filters = json.loads(rig.ns(rig.ns_s, "tc", "-j", "filter", "show", "dev", rig.if_sb,
                                "egress").stdout)
    assert len([f for f in filters if "options" in f]) == 1, filters
    assert _bpf_mounts() == mounts_before, "loading mounted a bpffs"

    capture = Capture(rig, tmp_path / "rx.pcap")
    try:
        result = rig.iperf(RUN_S)
    finally:
        wire = capture.stop()
    counters = marker.counters()[rig.port.intf]
    print(f"\n(b) step K={K_BYTES}: {result}\n    counters {counters}\n    wire {wire}")
    assert counters["ce_marked"] > 0 and counters["ce_bytes"] > 0
    assert counters["ect"] > counters["ce_marked"]
    assert result["retransmits"] < baseline["retransmits"], (result, baseline)
    assert result["mean_backlog"] < baseline["mean_backlog"], (result, baseline)
    assert wire["ce"] > 0 and wire["ece"] > 0 and wire["cwr"] > 0, wire
    assert wire["ce_bad_checksum"] == 0, wire


def test_changing_k_at_run_time_keeps_counters(rig: Rig, marker: ecn.Marker) -> None:
    """(c) New thresholds (and marking off) reprogram the same program: counters go on."""
    marker.set(rig.port, ecn.Marking.step(K_BYTES))
    prog = _prog_ids(rig)
    rig.iperf(1)
    first = marker.counters()[rig.port.intf]
    marker.set(rig.port, ecn.Marking(K_BYTES, 2 * K_BYTES, 0.5))
    right_after = marker.counters()[rig.port.intf]
    rig.iperf(1)
    second = marker.counters()[rig.port.intf]
    marker.set(rig.port, None)
    rig.iperf(1)
    off = marker.counters()[rig.port.intf]
    print(f"\n(c) step: {first}\n    after change: {right_after}\n    RED-style: {second}"
          f"\n    off: {off}")
    assert _prog_ids(rig) == prog, "changing K reloaded the program"
    for name in ecn.COUNTERS:
        assert right_after[name] >= first[name], name
    assert second["packets"] > first["packets"]
    assert second["ce_marked"] > first["ce_marked"]
    assert off["packets"] > second["packets"]
    assert off["ce_marked"] == second["ce_marked"], "marking off still marked"


def test_missing_port_is_an_error_naming_it(rig: Rig, marker: ecn.Marker) -> None:
    with pytest.raises(ecn.MarkerError, match=r"^nosuch0: "):
        marker.set(ecn.PortQueue("nosuch0", 10**7, 10**5), ecn.Marking.step(K_BYTES))
    assert marker.counters() == {}


def test_red_where_the_kernel_has_none_fails_and_keeps_the_bfifo(rig: Rig,
                                                                 build_dir: Path) -> None:
    """The RED marker's delete + add, for real: where the add fails the bfifo comes back.
    (Where the kernel has RED this checks the other way: marking on, counters, off.)"""
    red = ecn.make_marker("red", build_dir, netns_pid=rig.sleepers["s"])
    try:
        if qdisc_available("red limit 400000 min 30000 max 90000 avpkt 1500 burst 55 "
                           "probability 0.1 bandwidth 100mbit ecn"):
            red.set(rig.port, ecn.Marking.step(K_BYTES))
            red.set(rig.port, ecn.Marking(K_BYTES, 2 * K_BYTES, 0.2))
            assert set(red.counters()[rig.port.intf]) >= {"packets", "ce_marked"}
            red.set(rig.port, None)
        else:
            with pytest.raises(ecn.MarkerError, match=rf"^{rig.port.intf}: .*red limit"):
                red.set(rig.port, ecn.Marking.step(K_BYTES))
            assert red.counters() == {}
    finally:
        red.close()
    qdiscs = json.loads(rig.ns(rig.ns_s, "tc", "-j", "qdisc", "show", "dev", rig.if_sb).stdout)
    assert [(q["kind"], q["handle"]) for q in qdiscs] == [("htb", "1:"), ("bfifo", "10:")]
    assert qdiscs[1]["options"]["limit"] == QUEUE_BYTES


def _prog_ids(rig: Rig) -> list[int]:
    filters = json.loads(rig.ns(rig.ns_s, "tc", "-j", "filter", "show", "dev", rig.if_sb,
                                "egress").stdout)
    return [f["options"]["prog"]["id"] for f in filters if "options" in f]


def _bpf_mounts() -> list[str]:
    return [ln for ln in Path("/proc/self/mountinfo").read_text().splitlines()
            if " - bpf " in ln]
