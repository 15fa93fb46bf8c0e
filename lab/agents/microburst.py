"""Fixed-shape UDP micro-bursts: N frames back to back, far faster than the link, K times.

Incast is many senders answering at once; what the switch sees is a burst arriving at many
times the port's rate. iperf3 cannot make that shape (it paces, and TCP's window smooths
it), so this sender crafts ONE frame with scapy and writes copies of it through a raw
AF_PACKET socket as fast as Python can: the burst's shape is then fixed by the tool, not by a
congestion controller, and the queue's reaction (tail drops, CE marks) is the experiment.

Sender (inside the sending host's namespace)::

    python -m lab.agents.microburst --iface IF --src-mac M --dst-mac M --src-ip A --dst-ip B \\
        --sport P --dport Q --count N --size BYTES --ecn ect0|ect1|not-ect|ce \\
        --bursts K --gap-s G --out FILE

``--size`` is the UDP payload (the frame is 42 bytes more). The payload starts with
``MBU1``, the burst number, the sequence number within the burst and N (network order,
4 bytes each), so the receiver can tell packets apart and see which are missing. Bursts start
``--gap-s`` apart on a monotonic schedule. Output JSON: ``{"role": "sender", ...,
"frame_bytes", "scapy_import_s", "sent", "enobufs", "bursts": [{"burst", "t_first",
"t_last", "attempted", "sent", "enobufs", "offered_bps"}]}``; ``t_*`` are time.monotonic()
around the burst's sends, ``enobufs`` counts frames the local qdisc dropped (the kernel
reports a qdisc drop to an AF_PACKET sender as ENOBUFS), ``offered_bps`` is the rate at
which the burst was handed to the kernel.

Receiver::

    python -m lab.agents.microburst --recv --bind IP --port Q --expect N --timeout-s T --out FILE

counts datagrams per burst until ``--expect`` (total over all bursts) have arrived, ``T``
seconds have passed, or SIGTERM/SIGINT, and reads each datagram's TOS byte (IP_RECVTOS) to see
which were CE-marked on the way. Output JSON: ``{"role": "receiver", "received", "strays",
"socket_drops", "ecn": {not_ect, ect0, ect1, ce}, "ce", "stopped_by", "bursts": [{"burst",
"count", "received", "missing": [seq], "duplicates", "ecn", "ce", "ce_seqs",
"ce_arrival_positions", "t_first", "t_last"}], "datagrams": [[burst, seq, t, tos], ...]}``.
``ce_seqs`` are positions in the burst as sent, ``ce_arrival_positions`` as received; ``t``
is time.monotonic() at receipt (the same clock as the sender's: namespaces share it).
A burst none of whose datagrams arrived is not listed (the receiver cannot know of it).

Bad arguments: one line naming the argument on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import ipaddress
import re
import socket
import struct
import sys
import time
from typing import Any, NoReturn

from lab.agents.common import StopRequestedError, catch_signals, ignore_signals, write_json

MAGIC = b"MBU1"
#: Payload header: magic, burst number, sequence number in the burst, frames per burst.
HEADER = struct.Struct("!4sIII")
ETH_IP_UDP = 14 + 20 + 8
#: Where the burst and sequence numbers sit in the frame (after magic).
BURST_OFFSET = ETH_IP_UDP + 4
ECN_BITS = {"not-ect": 0, "ect1": 1, "ect0": 2, "ce": 3}
ECN_NAMES = ("not_ect", "ect1", "ect0", "ce")
#: Socket buffers big enough that neither end's socket shapes or drops the burst: the
#: queue under test should be the only place a frame can be lost.
SOCKET_BUFFER = 8 << 20
SIOCGIFMTU = 0x8921
SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40)
MAC_RE = re.compile(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}")


# --------------------------------------------------------------------------------------------
# Sender


def build_template(src_mac: str, dst_mac: str, src_ip: str, dst_ip: str, sport: int,
                   dport: int, size: int, ecn: str) -> bytes:
    """The one frame every burst is made of (burst 0, sequence 0), crafted with scapy.

    UDP checksum 0 ("none", legal for IPv4) so that patching the payload needs no checksum
    work; the IP header never changes (fixed id, DF), so its checksum stays right.
    """
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw
    payload = HEADER.pack(MAGIC, 0, 0, 0)
    payload += bytes(size - len(payload))
    pkt = (Ether(src=src_mac, dst=dst_mac)
           / IP(src=src_ip, dst=dst_ip, tos=ECN_BITS[ecn], id=0, flags="DF", ttl=64)
           / UDP(sport=sport, dport=dport, chksum=0) / Raw(payload))
    return bytes(pkt)


def burst_frames(template: bytes, burst: int, count: int) -> list[bytes]:
    """The frames of one burst, built before it starts so the burst itself is only sends."""
    frame = bytearray(template)
    struct.pack_into("!I", frame, BURST_OFFSET + 8, count)
    frames = []
    for seq in range(count):
        struct.pack_into("!II", frame, BURST_OFFSET, burst, seq)
        frames.append(bytes(frame))
    return frames


def open_packet_socket(iface: str) -> socket.socket:
    """A raw AF_PACKET socket that only sends (protocol 0: the kernel queues nothing to it).
    Frames go through the interface's qdisc like any other traffic, which is the point."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    _big_buffer(sock, socket.SO_SNDBUF, getattr(socket, "SO_SNDBUFFORCE", 32))
    sock.bind((iface, 0))
    return sock


def _big_buffer(sock: socket.socket, opt: int, force_opt: int) -> None:
    """SO_*BUFFORCE ignores the sysctl cap (we are root); fall back to the capped option."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, force_opt, SOCKET_BUFFER)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)


def send_burst(sock: socket.socket, frames: list[bytes], frame_bytes: int) -> dict[str, Any]:
    """Write the frames back to back; ENOBUFS (the qdisc dropped it) is counted, not fatal."""
    send = sock.send
    sent = enobufs = 0
    t_first = time.monotonic()
    for frame in frames:
        try:
            send(frame)
            sent += 1
        except OSError as e:
            if e.errno != errno.ENOBUFS:
                raise
            enobufs += 1
    t_last = time.monotonic()
    span = t_last - t_first
    return {"t_first": t_first, "t_last": t_last, "attempted": len(frames), "sent": sent,
            "enobufs": enobufs,
            "offered_bps": round(len(frames) * frame_bytes * 8 / span) if span > 0 else None}


def run_sender(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    template = build_template(args.src_mac, args.dst_mac, args.src_ip, args.dst_ip,
                              args.sport, args.dport, args.size, args.ecn)
    import_s = time.monotonic() - t0          # scapy's import dominates; kept out of bursts
    sock = open_packet_socket(args.iface)
    bursts = []
    # --start-at: several senders share one monotonic clock (every namespace does), so
    # their bursts can leave at the same instant and meet in one queue: a fixed shape.
    start = max(time.monotonic(), args.start_at or 0.0)
    try:
        for k in range(args.bursts):
            frames = burst_frames(template, k, args.count)
            delay = start + k * args.gap_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            bursts.append({"burst": k, **send_burst(sock, frames, len(template))})
    finally:
        sock.close()
    return {"role": "sender", "iface": args.iface, "src_ip": args.src_ip,
            "dst_ip": args.dst_ip, "sport": args.sport, "dport": args.dport,
            "ecn": args.ecn, "tos": ECN_BITS[args.ecn], "count": args.count,
            "size": args.size, "frame_bytes": len(template), "gap_s": args.gap_s,
            "scapy_import_s": round(import_s, 3),
            "sent": sum(b["sent"] for b in bursts),
            "enobufs": sum(b["enobufs"] for b in bursts), "bursts": bursts}


# --------------------------------------------------------------------------------------------
# Receiver


def open_receiver(bind: str, port: int) -> socket.socket:
    """A UDP socket that reports each datagram's TOS byte and the socket's own drop count
    (SO_RXQ_OVFL), so a loss in the network is never confused with a full socket."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _big_buffer(sock, socket.SO_RCVBUF, getattr(socket, "SO_RCVBUFFORCE", 33))
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
    sock.bind((bind, port))
    return sock


def _ancillary(ancdata: list[tuple[int, int, bytes]]) -> tuple[int, int]:
    """(TOS byte, socket drops so far; -1 when absent) from recvmsg's ancillary data."""
    tos = drops = -1
    for level, kind, data in ancdata:
        if level == socket.IPPROTO_IP and kind == socket.IP_TOS and data:
            tos = data[0]
        elif level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL and len(data) >= 4:
            drops = struct.unpack("=I", data[:4])[0]
    return tos, drops


def receive(sock: socket.socket, expect: int, timeout_s: float) -> dict[str, Any]:
    """Collect datagrams; returns the raw records and why it stopped."""
    anc = socket.CMSG_SPACE(4) * 2
    deadline = time.monotonic() + timeout_s
    datagrams: list[list[Any]] = []
    strays = socket_drops = 0
    stopped_by = "timeout"
    try:
        while len(datagrams) < expect:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            try:
                data, ancdata, _flags, _addr = sock.recvmsg(65536, anc)
            except TimeoutError:
                break
            t = time.monotonic()
            tos, drops = _ancillary(ancdata)
            socket_drops = max(socket_drops, drops)
            if len(data) < HEADER.size or data[:4] != MAGIC:
                strays += 1
                continue
            _magic, burst, seq, count = HEADER.unpack_from(data)
            datagrams.append([burst, seq, t, tos, count])
        else:
            stopped_by = "expect"
    except StopRequestedError:
        stopped_by = "signal"
    return {"datagrams": datagrams, "strays": strays, "socket_drops": socket_drops,
            "stopped_by": stopped_by}


def _ecn_counts(toses: list[int]) -> dict[str, int]:
    counts = dict.fromkeys(ECN_NAMES, 0)
    for tos in toses:
        if tos >= 0:
            counts[ECN_NAMES[tos & 3]] += 1
    return counts


def burst_report(burst: int, rows: list[list[Any]]) -> dict[str, Any]:
    """One burst's datagrams (in arrival order) → counts, gaps, and where CE marks fell."""
    count = rows[0][4]
    seqs = [r[1] for r in rows]
    seen = set(seqs)
    ce_rows = [(pos, r[1]) for pos, r in enumerate(rows) if r[3] >= 0 and r[3] & 3 == 3]
    return {"burst": burst, "count": count, "received": len(rows),
            "missing": [s for s in range(count) if s not in seen],
            "duplicates": len(seqs) - len(seen),
            "ecn": _ecn_counts([r[3] for r in rows]), "ce": len(ce_rows),
            "ce_seqs": [s for _, s in ce_rows],
            "ce_arrival_positions": [p for p, _ in ce_rows],
            "t_first": rows[0][2], "t_last": rows[-1][2]}


def receiver_report(got: dict[str, Any], expect: int) -> dict[str, Any]:
    per_burst: dict[int, list[list[Any]]] = {}
    for row in got["datagrams"]:
        per_burst.setdefault(row[0], []).append(row)
    ecn = _ecn_counts([r[3] for r in got["datagrams"]])
    return {"role": "receiver", "expected": expect, "received": len(got["datagrams"]),
            "strays": got["strays"], "socket_drops": got["socket_drops"],
            "stopped_by": got["stopped_by"], "ecn": ecn, "ce": ecn["ce"],
            "bursts": [burst_report(b, rows) for b, rows in sorted(per_burst.items())],
            "datagrams": [r[:4] for r in got["datagrams"]]}


def run_receiver(args: argparse.Namespace) -> dict[str, Any]:
    sock = open_receiver(args.bind, args.port)
    catch_signals()
    # The caller waits for this line before it starts sending.
    print(f"listening on {args.bind}:{args.port}", file=sys.stderr, flush=True)
    try:
        got = receive(sock, args.expect, args.timeout_s)
    finally:
        sock.close()
    # From here on a late signal must not cut the summary short.
    ignore_signals()
    return receiver_report(got, args.expect)


# --------------------------------------------------------------------------------------------
# Command line


class OneLineParser(argparse.ArgumentParser):
    """argparse prints the whole usage on an error; the lab wants one line naming the
    argument (it goes into a run log), and status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _int_in(lo: int, hi: int | None = None) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            bound = f">= {lo}" if hi is None else f"in {lo}..{hi}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value
    return parse


def _nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = _nonneg_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _mac(text: str) -> str:
    if not MAC_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"not a MAC address: {text!r}")
    return text.lower()


def _ipv4(text: str) -> str:
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IPv4 address: {text!r}") from None


SENDER_ARGS = ("iface", "src_mac", "dst_mac", "src_ip", "dst_ip", "sport", "dport", "count",
               "size")
SENDER_OPTIONAL = ("ecn", "bursts", "gap_s", "start_at")
RECEIVER_ARGS = ("bind", "port", "expect")
RECEIVER_OPTIONAL = ("timeout_s",)


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="python -m lab.agents.microburst", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recv", action="store_true", help="run the receiver")
    p.add_argument("--out", help="write the JSON here (default: stdout)")
    s = p.add_argument_group("sender")
    s.add_argument("--iface")
    s.add_argument("--src-mac", type=_mac)
    s.add_argument("--dst-mac", type=_mac)
    s.add_argument("--src-ip", type=_ipv4)
    s.add_argument("--dst-ip", type=_ipv4)
    s.add_argument("--sport", type=_int_in(1, 65535))
    s.add_argument("--dport", type=_int_in(1, 65535))
    s.add_argument("--count", type=_int_in(1), help="frames per burst")
    s.add_argument("--size", type=_int_in(HEADER.size, 65507),
                   help=f"UDP payload bytes (>= {HEADER.size}; frame = size + 42)")
    s.add_argument("--ecn", choices=sorted(ECN_BITS), help="ECN codepoint (default ect0)")
    s.add_argument("--bursts", type=_int_in(1), help="number of bursts (default 1)")
    s.add_argument("--gap-s", type=_nonneg_float,
                   help="seconds from one burst's start to the next's (default 0.1)")
    s.add_argument("--start-at", type=_nonneg_float,
                   help="time.monotonic() of the first burst (default: at once)")
    r = p.add_argument_group("receiver")
    r.add_argument("--bind", type=_ipv4)
    r.add_argument("--port", type=_int_in(1, 65535))
    r.add_argument("--expect", type=_int_in(1), help="datagrams in all bursts together")
    r.add_argument("--timeout-s", type=_positive_float, help="give up after (default 10)")
    return p


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_args(p: OneLineParser, args: argparse.Namespace) -> None:
    """What argparse cannot check alone: the mode's required arguments, no arguments of the
    other mode, and that the interface exists here and its MTU takes the frame."""
    need, optional, other = (RECEIVER_ARGS, RECEIVER_OPTIONAL, SENDER_ARGS + SENDER_OPTIONAL) \
        if args.recv else (SENDER_ARGS, SENDER_OPTIONAL, RECEIVER_ARGS + RECEIVER_OPTIONAL)
    for dest in other:
        if getattr(args, dest) is not None:
            p.error(f"argument {_flag(dest)}: not allowed "
                    f"{'with' if args.recv else 'without'} --recv")
    missing = [_flag(d) for d in need if getattr(args, d) is None]
    if missing:
        p.error(f"the following arguments are required: {', '.join(missing)}")
    defaults = {"ecn": "ect0", "bursts": 1, "gap_s": 0.1, "timeout_s": 10.0,
                "start_at": 0.0}
    for dest in optional:
        if getattr(args, dest) is None:
            setattr(args, dest, defaults[dest])
    if not args.recv:
        mtu = interface_mtu(args.iface)
        if mtu is None:
            p.error(f"argument --iface: no interface {args.iface!r} in this namespace")
        if args.size + 28 > mtu:
            p.error(f"argument --size: {args.size} + 28 header bytes exceeds "
                    f"{args.iface}'s MTU {mtu}")


def interface_mtu(iface: str) -> int | None:
    """The MTU by ioctl: /sys/class/net shows the *root* namespace's interfaces inside a
    Mininet host (it does not remount /sys), so it cannot be trusted there."""
    if not iface or len(iface.encode()) >= 16:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            res = fcntl.ioctl(s, SIOCGIFMTU, struct.pack("16si12x", iface.encode(), 0))
        except OSError:
            return None
    return struct.unpack("16si12x", res)[1]


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    check_args(p, args)
    try:
        report = run_receiver(args) if args.recv else run_sender(args)
    except OSError as e:
        print(f"{p.prog}: {e}", file=sys.stderr)
        return 1
    write_json(report, args.out)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
