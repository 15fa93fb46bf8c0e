"""What ECN did on the wire: capture at a receiver with tcpdump, then count the codepoints.

A congestion-control run reports what the *endpoints* believed (retransmits, cwnd); this module
reports what the *packets* carried, which is the only way to tell "the switch never marked"
from "it marked, but the sender never negotiated ECN" or "the receiver never echoed it":

- IPv4 ECN codepoint of every packet (Not-ECT, ECT(0), ECT(1), CE) with bytes: did the sender
  send ECN-capable traffic, and did a queue mark it?
- TCP ECE / CWR on ordinary segments: did the receiver echo the marks (ECE, ACK direction), and
  did the sender react (CWR, data direction)?
- SYN with ECE+CWR and SYN-ACK with ECE (RFC 3168 §6.1.1): was ECN negotiated at all? Without
  it every later mark is lost on the sender.

``start_capture`` runs tcpdump in a host (through a Mininet-like ``popen``) and returns only
once it is really capturing, so no packet of the experiment is missed; ``summarize`` reads the
file afterwards, overall and per flow (the data direction and its reverse, the ACKs).
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: How long tcpdump may take to say "listening on": it is fast, but 2 shared cores are slow.
START_TIMEOUT_S = 10.0
#: How long tcpdump may take to flush and print its statistics after SIGINT.
STOP_TIMEOUT_S = 10.0

ECN_NAMES = ("not_ect", "ect1", "ect0", "ce")     # indexed by the codepoint: 0b00 .. 0b11
TCP_FIN, TCP_SYN, TCP_ACK, TCP_ECE, TCP_CWR = 0x01, 0x02, 0x10, 0x40, 0x80
PROTO_NUMBERS = {"tcp": 6, "udp": 17, "icmp": 1}

# pcap link types whose IPv4 header we can find without dissecting.
DLT_EN10MB, DLT_RAW, DLT_RAW_BSD, DLT_RAW_OPENBSD = 1, 101, 12, 14
DLT_LINUX_SLL, DLT_LINUX_SLL2 = 113, 276
ETH_P_IP, ETH_P_8021Q, ETH_P_8021AD = 0x0800, 0x8100, 0x88A8

Popen = Callable[..., subprocess.Popen]


class CaptureError(RuntimeError):
    """tcpdump did not start (bad interface, no permission) or did not stop."""


@dataclass
class Capture:
    """A running tcpdump. ``pid`` is recorded by the lab so a crashed run can still be cleaned."""

    proc: subprocess.Popen
    path: Path
    stderr: bytearray = field(default_factory=bytearray)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> dict[str, int]:
        """SIGINT (tcpdump then flushes the file and prints its counters), wait, and return
        ``{"captured", "received_by_filter", "dropped_by_kernel"}`` from its stderr.

        ``dropped_by_kernel`` > 0 means the capture itself lost packets (ring buffer full) and
        every count from ``summarize`` is a lower bound. Signals by PID, never by name.
        """
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise CaptureError(f"tcpdump (pid {self.pid}) ignored SIGINT; killed") from None
        if self.proc.stderr is not None and not self.proc.stderr.closed:
            self.stderr += self.proc.stderr.read()
            self.proc.stderr.close()
        return parse_tcpdump_stats(self.stderr.decode(errors="replace"))


def tcpdump_argv(intf: str, path: Path, snaplen: int = 128) -> list[str]:
    """-U: write each packet as it arrives, so the file is whole even if tcpdump is killed;
    -n: no DNS look-ups inside a lab with no DNS; ``ip``: ECN is an IPv4 field here.

    --immediate-mode: without it libpcap hands packets over a ring *block* at a time (when
    full or after 1 s), and what is still in the block at SIGINT is never written: a 2 s
    iperf3 capture lost ~1/6 of its packets that way ("received by filter" > "captured").
    -B 8192: an 8 MiB ring, so a burst at Gbit/s is not "dropped by kernel" while the
    (unprivileged, single-core-sharing) tcpdump is not scheduled.
    """
    return ["tcpdump", "-i", intf, "-s", str(snaplen), "-B", "8192", "--immediate-mode", "-U",
            "-w", str(path), "-n", "ip"]


def start_capture(popen: Popen, intf: str, path: Path, snaplen: int = 128,
                  timeout_s: float = START_TIMEOUT_S) -> Capture:
    """Start tcpdump through ``popen`` (e.g. Mininet's ``host.popen``) and return once its
    stderr says "listening on": from then on the kernel buffers every packet for it.

    The default snaplen of 128 bytes holds every header we count (Ethernet, a VLAN tag, IPv4
    with options, TCP with options) while keeping a 10 Gbit/s capture's file small.
    """
    path = Path(path)
    proc = popen(tcpdump_argv(intf, path, snaplen), stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    cap = Capture(proc, path)
    try:
        _wait_listening(cap, timeout_s)
    except BaseException:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return cap


def _wait_listening(cap: Capture, timeout_s: float) -> None:
    """Read tcpdump's stderr (raw, unbuffered: a buffered reader could swallow the line we
    wait for) until it announces the capture, it exits, or the deadline passes."""
    assert cap.proc.stderr is not None
    fd = cap.proc.stderr.fileno()
    deadline = time.monotonic() + timeout_s
    while b"listening on" not in cap.stderr:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CaptureError(f"tcpdump did not start within {timeout_s} s: "
                               f"{cap.stderr.decode(errors='replace').strip()}")
        ready, _, _ = select.select([fd], [], [], min(left, 0.2))
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:                    # EOF: tcpdump exited (no such device, no permission)
            cap.proc.wait()
            raise CaptureError(f"tcpdump exited ({cap.proc.returncode}): "
                               f"{cap.stderr.decode(errors='replace').strip()}")
        cap.stderr += chunk


_STAT_LINES = {
    "captured": re.compile(r"(\d+) packets? captured"),
    "received_by_filter": re.compile(r"(\d+) packets? received by filter"),
    "dropped_by_kernel": re.compile(r"(\d+) packets? dropped by kernel"),
}


def parse_tcpdump_stats(stderr: str) -> dict[str, int]:
    """tcpdump's closing counters; -1 for any it did not print (it was killed)."""
    stats = {}
    for key, pattern in _STAT_LINES.items():
        m = pattern.search(stderr)
        stats[key] = int(m.group(1)) if m else -1
    return stats


# --------------------------------------------------------------------------------------------
# Counting

# Indexes into one direction's counter list (a flat list of ints is the cheapest thing to
# increment ~50k times from Python).
(I_PACKETS, I_BYTES, I_ECN, I_ECN_BYTES, I_TCP, I_SYN, I_SYNACK, I_ECN_SYN, I_ECN_SYNACK,
 I_ECE, I_CWR, I_UDP, I_UDP_BYTES) = 0, 1, 2, 6, 10, 11, 12, 13, 14, 15, 16, 17, 18
N_COUNTERS = 19


def _new_counters() -> list[int]:
    return [0] * N_COUNTERS


def _counters_dict(c: list[int]) -> dict[str, Any]:
    """One direction's counters as plain JSON-able data."""
    return {
        "packets": c[I_PACKETS],
        "bytes": c[I_BYTES],
        "ecn": {name: c[I_ECN + cp] for cp, name in enumerate(ECN_NAMES)},
        "ecn_bytes": {name: c[I_ECN_BYTES + cp] for cp, name in enumerate(ECN_NAMES)},
        "ce_bytes": c[I_ECN_BYTES + 3],
        "tcp": {"segments": c[I_TCP], "syn": c[I_SYN], "synack": c[I_SYNACK],
                "ecn_syn": c[I_ECN_SYN], "ecn_synack": c[I_ECN_SYNACK],
                "ece": c[I_ECE], "cwr": c[I_CWR]},
        "udp": c[I_UDP],
        "udp_bytes": c[I_UDP_BYTES],
    }


def _add(c: list[int], ip_len: int, cp: int, proto: int, flags: int) -> None:
    """Count one IPv4 packet. ``flags`` is the TCP flags byte (-1: none, a fragment)."""
    c[I_PACKETS] += 1
    c[I_BYTES] += ip_len
    c[I_ECN + cp] += 1
    c[I_ECN_BYTES + cp] += ip_len
    if proto == 6 and flags >= 0:
        c[I_TCP] += 1
        if flags & TCP_SYN:
            if flags & TCP_ACK:
                c[I_SYNACK] += 1
                # RFC 3168 §6.1.1: an ECN-setup SYN-ACK has ECE set and CWR clear.
                if flags & (TCP_ECE | TCP_CWR) == TCP_ECE:
                    c[I_ECN_SYNACK] += 1
            else:
                c[I_SYN] += 1
                if flags & (TCP_ECE | TCP_CWR) == TCP_ECE | TCP_CWR:
                    c[I_ECN_SYN] += 1
        else:
            # On a SYN the two bits mean "I speak ECN", not congestion: count them apart.
            if flags & TCP_ECE:
                c[I_ECE] += 1
            if flags & TCP_CWR:
                c[I_CWR] += 1
    elif proto == 17 and flags >= 0:
        c[I_UDP] += 1
        c[I_UDP_BYTES] += ip_len


@dataclass(frozen=True)
class WireFlow:
    """A flow as the lab names it; None fields match anything (an ephemeral client port)."""

    key: str
    src: bytes | None
    dst: bytes | None
    proto: int | None
    sport: int | None
    dport: int | None

    def direction(self, src: bytes, dst: bytes, proto: int, sport: int, dport: int) -> int:
        """0: the data direction, 1: the reverse (ACKs), -1: not this flow."""
        if self.proto is not None and proto != self.proto:
            return -1
        if _eq(self.src, src) and _eq(self.dst, dst) and _eq(self.sport, sport) \
                and _eq(self.dport, dport):
            return 0
        if _eq(self.src, dst) and _eq(self.dst, src) and _eq(self.sport, dport) \
                and _eq(self.dport, sport):
            return 1
        return -1


def _eq(want: object, got: object) -> bool:
    return want is None or want == got


def flow_key(flow: dict[str, Any]) -> str:
    """The flow's "id", else ``src:sport->dst:dport/proto`` (``*`` for a wildcard)."""
    if flow.get("id") is not None:
        return str(flow["id"])

    def show(v: object) -> str:
        return "*" if v is None else str(v)
    return (f"{show(flow.get('src_ip'))}:{show(flow.get('sport'))}->"
            f"{show(flow.get('dst_ip'))}:{show(flow.get('dport'))}/{show(flow.get('proto'))}")


def _parse_flow(flow: dict[str, Any]) -> WireFlow:
    import socket

    def addr(v: str | None) -> bytes | None:
        return None if v is None else socket.inet_aton(v)

    proto = flow.get("proto")
    if isinstance(proto, str):
        if proto.lower() not in PROTO_NUMBERS:
            raise ValueError(f"flow {flow_key(flow)}: unknown proto {proto!r}")
        proto = PROTO_NUMBERS[proto.lower()]
    sport, dport = flow.get("sport"), flow.get("dport")
    return WireFlow(flow_key(flow), addr(flow.get("src_ip")), addr(flow.get("dst_ip")), proto,
                    None if sport is None else int(sport), None if dport is None else int(dport))


def _ip_offset(linktype: int, frame: bytes) -> int:
    """Where the IPv4 header starts in one record, -1 if it is not IPv4."""
    if linktype == DLT_EN10MB:
        if len(frame) < 14:
            return -1
        off, ethertype = 14, (frame[12] << 8) | frame[13]
        while ethertype in (ETH_P_8021Q, ETH_P_8021AD) and len(frame) >= off + 4:
            ethertype = (frame[off + 2] << 8) | frame[off + 3]
            off += 4
        return off if ethertype == ETH_P_IP else -1
    if linktype in (DLT_RAW, DLT_RAW_BSD, DLT_RAW_OPENBSD):
        return 0 if frame and frame[0] >> 4 == 4 else -1
    if linktype == DLT_LINUX_SLL:                  # 16-byte header, protocol at 14
        return 16 if len(frame) >= 16 and frame[14:16] == b"\x08\x00" else -1
    if linktype == DLT_LINUX_SLL2:                 # 20-byte header, protocol at 0
        return 20 if len(frame) >= 20 and frame[0:2] == b"\x08\x00" else -1
    return -1


def _records(path: Path) -> Iterator[tuple[int, bytes]]:
    """(linktype, frame bytes) per record, streaming: a capture can be tens of MB.

    scapy's RawPcapReader is PcapReader without the dissection: it handles pcap and pcapng
    (it picks the reader from the magic) and byte order, and yields each record's bytes.
    """
    from scapy.utils import RawPcapReader
    with RawPcapReader(str(path)) as reader:
        default = getattr(reader, "linktype", DLT_EN10MB)
        for frame, meta in reader:
            yield getattr(meta, "linktype", default), frame


def summarize(path: Path, flows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Count ECN codepoints and TCP ECN flags in a capture, overall and per flow.

    Returns ``{"packets": records, "ipv4": .., "other": non-IPv4 records, **overall counters,
    "flows": {key: {"flow": flow, "forward": counters, "reverse": counters}}}`` where counters
    are ``{"packets", "bytes", "ecn": {not_ect, ect0, ect1, ce}, "ecn_bytes": {..},
    "ce_bytes", "tcp": {segments, syn, synack, ecn_syn, ecn_synack, ece, cwr}, "udp",
    "udp_bytes"}``; bytes are IPv4 total lengths (what the wire carried, not the snaplen).
    "ece"/"cwr" count non-SYN segments only (congestion echo / reaction); the SYN handshake's
    use of the same bits is counted as "ecn_syn"/"ecn_synack".

    Why raw bytes and not scapy's dissection: PcapReader builds a full Packet per record,
    ~130 µs each on the CI machine, so 50k packets took 6.7 s; the headers we need are
    fixed-format (Ethernet, IPv4, the first 14 bytes of TCP/UDP), and slicing them by hand
    reads the same 50k in ~0.1 s (~450k packets/s). scapy still reads the file (pcap or
    pcapng, either byte order).
    """
    specs = [_parse_flow(f) for f in flows or []]
    overall = _new_counters()
    per_flow = [[_new_counters(), _new_counters()] for _ in specs]
    # Which flow directions a 5-tuple belongs to, computed once per distinct 5-tuple.
    match_cache: dict[tuple[bytes, bytes, int, int, int], list[list[int]]] = {}
    records = other = 0
    for linktype, frame in _records(path):
        records += 1
        off = _ip_offset(linktype, frame)
        if off < 0 or len(frame) < off + 20 or frame[off] >> 4 != 4:
            other += 1
            continue
        ihl = (frame[off] & 0x0F) * 4
        cp = frame[off + 1] & 0x03
        ip_len = (frame[off + 2] << 8) | frame[off + 3]
        proto = frame[off + 9]
        first_fragment = (frame[off + 6] & 0x1F) == 0 and frame[off + 7] == 0
        l4 = off + ihl
        sport = dport = 0
        flags = -1
        if first_fragment and proto in (6, 17) and len(frame) >= l4 + (14 if proto == 6 else 4):
            sport = (frame[l4] << 8) | frame[l4 + 1]
            dport = (frame[l4 + 2] << 8) | frame[l4 + 3]
            flags = frame[l4 + 13] if proto == 6 else 0
        _add(overall, ip_len, cp, proto, flags)
        if not specs:
            continue
        five = (frame[off + 12:off + 16], frame[off + 16:off + 20], proto, sport, dport)
        targets = match_cache.get(five)
        if targets is None:
            targets = match_cache[five] = [
                per_flow[i][d] for i, s in enumerate(specs)
                if (d := s.direction(*five)) >= 0]
        for c in targets:
            _add(c, ip_len, cp, proto, flags)
    out: dict[str, Any] = {"packets": records, "ipv4": overall[I_PACKETS], "other": other}
    out.update({k: v for k, v in _counters_dict(overall).items() if k != "packets"})
    out["flows"] = {
        s.key: {"flow": dict(f), "forward": _counters_dict(fw), "reverse": _counters_dict(rv)}
        for s, f, (fw, rv) in zip(specs, flows or [], per_flow, strict=True)}
    return out
