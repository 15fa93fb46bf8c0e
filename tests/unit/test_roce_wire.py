"""RoCEv2 packets as ``lab/agents/roce/wire.c`` builds them, byte by byte, and its ICRC;
then one queue pair's state machines (``qp.c``) driven packet by packet over those headers.

Why the expected bytes are written out here with ``struct.pack`` and the ICRC computed with
``zlib.crc32``: the C file is the transport's only packet builder, so the test states the
Annex A17 layout independently (a second reading of the spec, not a second copy of the
code) and the ICRC's masking rule once more in Python. tshark's decoding of real captured
packets is checked by tests/integration/test_roce_transport.py.
"""

from __future__ import annotations

import ctypes
import struct
import zlib
from pathlib import Path

import pytest

from controllers import cbuild
from lab.agents import roce
from tests.unit.cmirror import compiler_values, layout_mismatch

ROCE = roce.DIR
SRC, DST = 0x0A4D0101, 0x0A4D0202          # 10.77.1.1 -> 10.77.2.2
PSN_SPACE = 1 << 24


class Ip(ctypes.Structure):
    """``struct roce_ip`` of wire.h (checked against the compiler below)."""

    _fields_ = [("saddr", ctypes.c_uint32), ("daddr", ctypes.c_uint32),
                ("sport", ctypes.c_uint16), ("ip_id", ctypes.c_uint16),
                ("tos", ctypes.c_uint8), ("ttl", ctypes.c_uint8)]


class Hdr(ctypes.Structure):
    """``struct roce_hdr`` of wire.h (checked against the compiler below)."""

    _fields_ = [("opcode", ctypes.c_uint8), ("se", ctypes.c_uint8), ("mig", ctypes.c_uint8),
                ("pad", ctypes.c_uint8), ("pkey", ctypes.c_uint16), ("dqpn", ctypes.c_uint32),
                ("ackreq", ctypes.c_uint8), ("resv8a", ctypes.c_uint8),
                ("psn", ctypes.c_uint32), ("va", ctypes.c_uint64), ("rkey", ctypes.c_uint32),
                ("dma_len", ctypes.c_uint32), ("syndrome", ctypes.c_uint8),
                ("msn", ctypes.c_uint32)]



@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """wire.c built as the program builds it (clang -Wall -Wextra -Werror), once."""
    so = cbuild.build("roce-wire", [ROCE / "wire.c"], shared=True,
                      build_dir=tmp_path_factory.mktemp("roce-wire"))
    dl = ctypes.CDLL(str(so))
    dl.roce_build.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(Ip),
                              ctypes.POINTER(Hdr), ctypes.c_size_t]
    dl.roce_build.restype = ctypes.c_size_t
    dl.roce_parse.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(Hdr),
                              ctypes.POINTER(ctypes.c_size_t)]
    dl.roce_parse.restype = ctypes.c_int
    dl.roce_icrc.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    dl.roce_icrc.restype = ctypes.c_uint32
    dl.roce_psn_add.argtypes = [ctypes.c_uint32, ctypes.c_uint32]
    dl.roce_psn_add.restype = ctypes.c_uint32
    dl.roce_psn_diff.argtypes = [ctypes.c_uint32, ctypes.c_uint32]
    dl.roce_psn_diff.restype = ctypes.c_int32
    return dl


def build(lib: ctypes.CDLL, payload: int = 0, *, tos: int = 0x6A, **fields: int) -> bytes:
    """One packet from wire.c: 10.77.1.1:50000 -> 10.77.2.2:4791, ID 0x1234, TTL 64."""
    ip = Ip(saddr=SRC, daddr=DST, sport=50000, ip_id=0x1234, tos=tos, ttl=64)
    hdr = Hdr(pkey=0xFFFF, **fields)
    buf = ctypes.create_string_buffer(8192)
    n = lib.roce_build(buf, len(buf), ctypes.byref(ip), ctypes.byref(hdr), payload)
    assert n, f"roce_build refused {fields}"
    return buf.raw[:n]


def icrc_by_zlib(pkt: bytes) -> bytes:
    """The ICRC as Annex A17 describes it, independently of wire.c: CRC-32 over 8 bytes of
    ones (RoCEv2's stand-in for the LRH), the packet with TOS, TTL, IP checksum, UDP
    checksum and BTH byte 4 set to ones, up to the ICRC; stored little-endian as rxe does."""
    masked = bytearray(pkt[:-4])
    masked[1] = 0xFF                       # TOS (DSCP and ECN: routers rewrite them)
    masked[8] = 0xFF                       # TTL
    masked[10:12] = b"\xff\xff"            # IPv4 header checksum
    masked[26:28] = b"\xff\xff"            # UDP checksum
    masked[32] = 0xFF                      # BTH resv8a
    return struct.pack("<I", zlib.crc32(b"\xff" * 8 + bytes(masked)))


def ip_checksum(header: bytes) -> int:
    total = sum(struct.unpack("!10H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def expected(transport: bytes, body: int, *, tos: int = 0x6A) -> bytes:
    """IPv4 (DF, TTL 64, UDP) + UDP (checksum 0) + ``transport`` + ``body`` zeros, the ICRC
    left as four zero bytes (checked separately)."""
    length = 20 + 8 + len(transport) + body + 4
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, tos, length, 0x1234, 0x4000, 64, 17, 0,
                     SRC.to_bytes(4, "big"), DST.to_bytes(4, "big"))
    ip = ip[:10] + struct.pack("!H", ip_checksum(ip)) + ip[12:]
    udp = struct.pack("!HHHH", 50000, 4791, length - 20, 0)
    return ip + udp + transport + bytes(body) + bytes(4)


def bth(opcode: int, dqpn: int, psn: int, *, ackreq: int = 0, pad: int = 0) -> bytes:
    """The 12-byte BTH: opcode; SE|M|pad|TVer; P_Key; resv8a; dest QP; A|resv7; PSN."""
    return struct.pack("!BBHB3sB3s", opcode, pad << 4, 0xFFFF, 0, dqpn.to_bytes(3, "big"),
                       ackreq << 7, psn.to_bytes(3, "big"))


RETH = struct.pack("!QII", 0x10000000, 0x1234, 4096)

#: (name, build fields, payload, expected transport headers, payload bytes on the wire)
CASES = [
    ("write-first", dict(opcode=0x06, dqpn=0x000123, psn=100, va=0x10000000, rkey=0x1234,
                         dma_len=4096), 1024, bth(0x06, 0x123, 100) + RETH, 1024),
    ("write-middle", dict(opcode=0x07, dqpn=0x000123, psn=101), 1024,
     bth(0x07, 0x123, 101), 1024),
    ("write-last", dict(opcode=0x08, dqpn=0x000123, psn=103, ackreq=1), 1024,
     bth(0x08, 0x123, 103, ackreq=1), 1024),
    ("write-only", dict(opcode=0x0A, dqpn=0xABCDEF, psn=0xFFFFFF, ackreq=1, va=0x10000000,
                        rkey=0x1234, dma_len=4096), 1024,
     bth(0x0A, 0xABCDEF, 0xFFFFFF, ackreq=1) + RETH, 1024),
    ("write-only-padded", dict(opcode=0x0A, dqpn=7, psn=5, ackreq=1, pad=3, va=0x10000000,
                               rkey=0x1234, dma_len=4096), 5,
     bth(0x0A, 7, 5, ackreq=1, pad=3) + RETH, 8),
    ("ack", dict(opcode=0x11, dqpn=0x000122, psn=103, syndrome=0x1F, msn=9), 0,
     bth(0x11, 0x122, 103) + struct.pack("!B3s", 0x1F, (9).to_bytes(3, "big")), 0),
    ("nak-psn-sequence-error", dict(opcode=0x11, dqpn=0x000122, psn=0xFFFFFE, syndrome=0x60,
                                    msn=0xFFFFFF), 0,
     bth(0x11, 0x122, 0xFFFFFE) + struct.pack("!B3s", 0x60, b"\xff\xff\xff"), 0),
    ("cnp", dict(opcode=0x81, dqpn=0x000122), 0, bth(0x81, 0x122, 0) + bytes(16), 0),
]


@pytest.mark.parametrize("name, fields, payload, transport, body", CASES,
                         ids=[c[0] for c in CASES])
def test_header_layout_byte_by_byte(lib: ctypes.CDLL, name: str, fields: dict,
                                    payload: int, transport: bytes, body: int) -> None:
    """Every header byte where Annex A17 puts it (the ICRC's 4 bytes compared apart)."""
    tos = 0xC0 if name == "cnp" else 0x6A         # CNPs: DSCP 48, not ECN-capable
    pkt = build(lib, payload, tos=tos, **fields)
    want = expected(transport, body, tos=tos)
    assert len(pkt) == len(want), name
    for i, (got, exp) in enumerate(zip(pkt[:-4], want[:-4], strict=True)):
        assert got == exp, f"{name}: byte {i}: {got:#04x}, want {exp:#04x}"
    assert pkt[-4:] == icrc_by_zlib(pkt), name


@pytest.mark.parametrize("name, fields, payload, transport, body", CASES,
                         ids=[c[0] for c in CASES])
def test_parse_reads_back_what_was_built(lib: ctypes.CDLL, name: str, fields: dict,
                                         payload: int, transport: bytes, body: int) -> None:
    """The receiver's parser (UDP payload in, as a UDP socket delivers) inverts the builder."""
    pkt = build(lib, payload, **fields)
    h, n = Hdr(), ctypes.c_size_t()
    assert lib.roce_parse(pkt[28:], len(pkt) - 28, ctypes.byref(h), ctypes.byref(n)) == 0
    for key, value in fields.items():
        assert getattr(h, key) == value, (name, key)
    assert n.value == (payload if body else 0), name


def test_parse_refuses_what_it_cannot_read(lib: ctypes.CDLL) -> None:
    """Too short, an opcode this transport does not speak, a pad count beyond the payload."""
    h = Hdr()
    good = build(lib, 0, opcode=0x11, dqpn=1, psn=1, syndrome=0x1F)[28:]
    assert lib.roce_parse(good, len(good), ctypes.byref(h), None) == 0
    assert lib.roce_parse(good[:15], 15, ctypes.byref(h), None) == -1
    unknown = b"\x04" + good[1:]                     # RC SEND Only
    assert lib.roce_parse(unknown, len(unknown), ctypes.byref(h), None) == -1
    only = bytearray(build(lib, 0, opcode=0x0A, dqpn=1, psn=1)[28:])
    only[1] |= 3 << 4                                # pad 3 with no payload
    assert lib.roce_parse(bytes(only), len(only), ctypes.byref(h), None) == -1


def test_icrc_covers_what_routers_keep_and_masks_what_they_change(lib: ctypes.CDLL) -> None:
    """ECN marking, a new DSCP, a TTL decrement, the checksums and resv8a leave the ICRC
    as it was; the IP ID, an address, a port, the PSN or a payload byte change it."""
    pkt = build(lib, 256, opcode=0x07, dqpn=0x123, psn=42)
    icrc = lib.roce_icrc(pkt, len(pkt))
    assert struct.pack("<I", icrc) == pkt[-4:] == icrc_by_zlib(pkt)
    for offset, value in ((1, 0x6B), (1, 0x00), (8, 63), (10, 0), (11, 0), (26, 0xAB),
                          (32, 0x40)):
        changed = bytearray(pkt)
        changed[offset] = value
        assert lib.roce_icrc(bytes(changed), len(pkt)) == icrc, offset
    for offset in (4, 5, 15, 19, 20, 21, 29, 39, 100, len(pkt) - 5):
        changed = bytearray(pkt)
        changed[offset] ^= 0x01
        assert lib.roce_icrc(bytes(changed), len(pkt)) != icrc, offset


def test_icrc_of_long_packets_matches_zlib(lib: ctypes.CDLL) -> None:
    """The slicing-by-8 loop against zlib over every payload length mod 8 and a full 4 KiB."""
    for payload in (*range(1, 17), 1023, 4096):
        pad = -payload % 4
        pkt = build(lib, payload, opcode=0x07, dqpn=9, psn=payload, pad=pad)
        assert pkt[-4:] == icrc_by_zlib(pkt), payload


def test_psn_arithmetic_wraps_at_24_bits(lib: ctypes.CDLL) -> None:
    """PSNs are 24-bit: 0xFFFFFF + 1 is 0, and 0 is one ahead of 0xFFFFFF."""
    assert lib.roce_psn_add(PSN_SPACE - 1, 1) == 0
    assert lib.roce_psn_add(PSN_SPACE - 3, 10) == 7
    assert lib.roce_psn_add(5, PSN_SPACE - 1) == 4          # adding 2^24 - 1 is minus one
    assert lib.roce_psn_diff(0, PSN_SPACE - 1) == 1
    assert lib.roce_psn_diff(PSN_SPACE - 1, 0) == -1
    assert lib.roce_psn_diff(3, PSN_SPACE - 5) == 8
    assert lib.roce_psn_diff(100, 100) == 0
    assert lib.roce_psn_diff(PSN_SPACE // 2 - 1, 0) == PSN_SPACE // 2 - 1
    assert lib.roce_psn_diff(PSN_SPACE // 2, 0) == -(PSN_SPACE // 2)


def test_build_refuses_unknown_opcodes_and_small_buffers(lib: ctypes.CDLL) -> None:
    ip, buf = Ip(saddr=SRC, daddr=DST, sport=1, ip_id=1, tos=0, ttl=64), \
        ctypes.create_string_buffer(2048)
    assert lib.roce_build(buf, len(buf), ctypes.byref(ip), ctypes.byref(Hdr(opcode=0x04)),
                          0) == 0
    only = Hdr(opcode=0x0A)
    assert lib.roce_build(buf, 1000, ctypes.byref(ip), ctypes.byref(only), 1024) == 0
    assert lib.roce_build(buf, 2048, ctypes.byref(ip), ctypes.byref(only), 1024) == \
        20 + 8 + 12 + 16 + 1024 + 4


def test_the_structs_are_laid_out_as_the_compiler_lays_them(tmp_path: Path) -> None:
    """A mirror that drifts from wire.h would write the wrong fields silently: the compiler
    is asked each field's type (a wrong name or type does not compile), offset and size."""
    assert layout_mismatch(ROCE / "wire.h", [("roce_ip", Ip), ("roce_hdr", Hdr)], tmp_path) == []


# ---- one queue pair (qp.c) over these headers -----------------------------------------

class Config(ctypes.Structure):
    """``struct qp_config`` of qp.h (checked against the compiler below)."""

    _fields_ = [("mtu", ctypes.c_uint32), ("msg_size", ctypes.c_uint64),
                ("tx_depth", ctypes.c_uint32), ("iters", ctypes.c_uint64),
                ("ackreq_every", ctypes.c_uint32), ("rto_ns", ctypes.c_uint64),
                ("retry_cnt", ctypes.c_uint32), ("start_psn", ctypes.c_uint32),
                ("cc_dcqcn", ctypes.c_int), ("line_rate_bps", ctypes.c_double),
                ("burst_pkts", ctypes.c_uint32), ("sport", ctypes.c_uint16),
                ("max_unacked", ctypes.c_uint32), ("nak_once_per_retry", ctypes.c_int),
                ("spray", ctypes.c_uint32)]


class ReqCounters(ctypes.Structure):
    """``struct qp_req_counters`` of qp.h."""

    _fields_ = [(name, ctypes.c_uint64) for name in (
        "packets_sent", "payload_bytes_sent", "wire_bytes_sent", "retransmitted_packets",
        "acks_received", "naks_received", "cnps_received", "rto_events", "naks_ignored",
        "messages_posted", "messages_completed")]


class RespCounters(ctypes.Structure):
    """``struct qp_resp_counters`` of qp.h."""

    _fields_ = [(name, ctypes.c_uint64) for name in (
        "packets_received", "payload_bytes_received", "wire_bytes_received",
        "messages_received", "duplicates", "out_of_sequence", "placed_out_of_order",
        "acks_sent", "naks_sent", "cnps_sent", "ce_received")]


MS = 1_000_000
LINE = 100e6


class QpLib:
    """qp.c (with wire.c and dcqcn.c) as a shared library, and the sizes and offsets of
    its structs as the compiler has them, so Python reads the counters where C wrote them."""

    def __init__(self, tmp: Path) -> None:
        self.dl = ctypes.CDLL(str(cbuild.build(
            "roce-qp", roce.LIBRARY, shared=True,
            build_dir=tmp / "build")))
        assert layout_mismatch(ROCE / "qp.h", [
            ("qp_config", Config), ("qp_req_counters", ReqCounters),
            ("qp_resp_counters", RespCounters)], tmp) == []
        (self.req_size, self.req_n, self.req_state, self.resp_size,
         self.resp_n) = compiler_values(ROCE / "qp.h", [
             "sizeof(struct qp_requester)", "offsetof(struct qp_requester, n)",
             "offsetof(struct qp_requester, state)", "sizeof(struct qp_responder)",
             "offsetof(struct qp_responder, n)"], tmp / "opaque")
        vp, hp, u64 = ctypes.c_void_p, ctypes.POINTER(Hdr), ctypes.c_uint64
        for name, args, res in (
                ("qp_req_init", [vp, ctypes.POINTER(Config), ctypes.c_uint32, ctypes.c_uint32,
                                 u64], ctypes.c_int),
                ("qp_req_free", [vp], None), ("qp_req_next_len", [vp], ctypes.c_size_t),
                ("qp_req_take", [vp, hp, ctypes.POINTER(ctypes.c_size_t), u64],
                 ctypes.c_size_t),
                ("qp_req_on_packet", [vp, hp, u64], None), ("qp_req_advance", [vp, u64], None),
                ("qp_req_rate_bps", [vp], ctypes.c_double),
                ("qp_req_post_upto", [vp, u64, u64], None),
                ("qp_resp_init", [vp, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32, u64],
                 None),
                ("qp_resp_on_data", [vp, hp, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int,
                                     u64], None),
                ("qp_resp_response", [vp, hp], ctypes.c_int),
                ("qp_resp_cnp", [vp, hp], ctypes.c_int),
                ("qp_resp_set_placement", [vp, ctypes.c_int, ctypes.c_uint32], None),
                ("roce_udp_sport", [ctypes.c_uint32, ctypes.c_uint16, u64, ctypes.c_uint32],
                 ctypes.c_uint16)):
            fn = getattr(self.dl, name)
            fn.argtypes, fn.restype = args, res


class Requester:
    """A requester QP 0x100 -> 0x101 at 100 Mbit/s, driven with explicit times (ns)."""

    def __init__(self, lib: QpLib, **cfg: float) -> None:
        self.lib, self.buf = lib, ctypes.create_string_buffer(lib.req_size)
        config = Config(**{"mtu": 1024, "msg_size": 4096, "tx_depth": 2, "ackreq_every": 64,
                           "rto_ns": 4 * MS, "retry_cnt": 7, "line_rate_bps": LINE,
                           "burst_pkts": 4, **cfg})
        assert lib.dl.qp_req_init(self.buf, ctypes.byref(config), 0x100, 0x101, 0) == 0

    def take(self, now: int = 0) -> Hdr | None:
        h, n = Hdr(), ctypes.c_size_t()
        return h if self.lib.dl.qp_req_take(self.buf, ctypes.byref(h), ctypes.byref(n),
                                            now) else None

    def take_all(self, now: int = 0) -> list[Hdr]:
        out = []
        while (h := self.take(now)) is not None:
            out.append(h)
        return out

    def receive(self, now: int = 0, **fields: int) -> None:
        self.lib.dl.qp_req_on_packet(self.buf, ctypes.byref(Hdr(**fields)), now)

    def advance(self, now: int) -> None:
        self.lib.dl.qp_req_advance(self.buf, now)

    @property
    def n(self) -> ReqCounters:
        return ReqCounters.from_buffer(self.buf, self.lib.req_n)

    @property
    def failed(self) -> bool:
        return ctypes.c_int.from_buffer(self.buf, self.lib.req_state).value != 0

    def close(self) -> None:
        self.lib.dl.qp_req_free(self.buf)


@pytest.fixture(scope="module")
def qplib(tmp_path_factory: pytest.TempPathFactory) -> QpLib:
    return QpLib(tmp_path_factory.mktemp("roce-qp"))


def test_a_message_becomes_first_middle_last_across_the_psn_wrap(qplib: QpLib) -> None:
    """4096 + 100 bytes at MTU 1024: First (RETH) / 3 Middle / Last with AckReq, PSNs
    crossing 2^24; the send queue (tx_depth 2) then holds back a third message."""
    q = Requester(qplib, msg_size=4196, start_psn=PSN_SPACE - 2)
    pkts = q.take_all()
    assert [h.opcode for h in pkts] == [0x06, 0x07, 0x07, 0x07, 0x08] * 2
    assert [h.psn for h in pkts[:5]] == [PSN_SPACE - 2, PSN_SPACE - 1, 0, 1, 2]
    assert [h.ackreq for h in pkts] == [0, 0, 0, 0, 1] * 2
    assert (pkts[0].va, pkts[0].dma_len, pkts[5].va) == (0x10000000, 4196, 0x10000000 + 4196)
    assert all(h.dqpn == 0x101 for h in pkts) and qplib.dl.qp_req_next_len(q.buf) == 0
    assert (q.n.packets_sent, q.n.payload_bytes_sent) == (10, 2 * 4196)
    q.receive(opcode=0x11, psn=2, syndrome=0x1F)          # the first message's last PSN
    assert (q.n.messages_completed, q.n.messages_posted) == (1, 3)
    assert q.take().psn == 8                               # the third message goes out
    q.close()


def test_a_nak_goes_back_to_the_psn_it_names(qplib: QpLib) -> None:
    """NAK (PSN sequence error) for p: everything before p is acknowledged and sending
    starts again at p; the packets sent again are counted as retransmitted."""
    q = Requester(qplib, start_psn=PSN_SPACE - 1)
    q.take_all()                                           # PSNs 2^24-1, 0 .. 6
    q.receive(opcode=0x11, psn=1, syndrome=0x60)           # expected: 1, i.e. packet 2
    assert (q.n.naks_received, q.n.messages_completed) == (1, 0)
    again = q.take_all()
    assert [h.psn for h in again] == [1, 2, 3, 4, 5, 6]
    assert q.n.retransmitted_packets == 6
    q.receive(opcode=0x11, psn=6, syndrome=0x1F)
    assert q.n.messages_completed == 2 and not q.failed
    q.close()


def test_like_rxe_a_nak_during_a_retry_waits_for_a_message_to_complete(qplib: QpLib) -> None:
    """rxe's rule (rxe_comp.c, started_retry): after going back, a NAK that arrives before
    a message completes is ignored (its PSN still acknowledges); once one completes, a NAK
    goes back again. The spec's rule, the default, goes back on every NAK."""
    for rxe_rule, after_second in ((1, []), (0, [2, 3, 4, 5, 6, 7])):
        q = Requester(qplib, nak_once_per_retry=rxe_rule)
        q.take_all()                                       # PSNs 0 .. 7, two messages
        q.receive(opcode=0x11, psn=1, syndrome=0x60)
        assert [h.psn for h in q.take_all()] == [1, 2, 3, 4, 5, 6, 7]
        q.receive(opcode=0x11, psn=2, syndrome=0x60)       # a second loss in message 0
        assert [h.psn for h in q.take_all()] == after_second
        assert (q.n.naks_received, q.n.naks_ignored) == (2, rxe_rule)
        q.receive(opcode=0x11, psn=3, syndrome=0x1F)       # message 0 completes: 2 posted
        q.receive(opcode=0x11, psn=5, syndrome=0x60)
        assert [h.psn for h in q.take_all()] == list(range(5, 12))
        assert q.n.messages_completed == 1 and not q.failed
        q.close()


def test_like_rxe_at_most_max_unacked_packets_are_out(qplib: QpLib) -> None:
    """rxe's window (RXE_MAX_UNACKED_PSNS): no packet beyond una + max_unacked."""
    q = Requester(qplib, max_unacked=3)
    assert [h.psn for h in q.take_all()] == [0, 1, 2]
    q.receive(opcode=0x11, psn=0, syndrome=0x1F)
    assert [h.psn for h in q.take_all()] == [3]
    q.close()


def test_the_timer_goes_back_and_the_retry_limit_fails_the_qp(qplib: QpLib) -> None:
    """No ACK for rto after the AckReq packet: back to the oldest unacknowledged packet;
    retry_cnt + 1 timeouts without progress put the QP in the error state."""
    q = Requester(qplib, tx_depth=1, retry_cnt=2)
    q.take_all()
    q.receive(opcode=0x11, psn=1, syndrome=0x1F, now=MS)   # progress: packets 0 and 1
    q.advance(4 * MS)                                      # the timer restarted at 1 ms
    assert q.n.rto_events == 0
    q.advance(5 * MS)
    assert q.n.rto_events == 1 and [h.psn for h in q.take_all(5 * MS)] == [2, 3]
    q.advance(9 * MS)                                      # re-armed by PSN 3 at 5 ms
    assert q.n.rto_events == 2 and not q.failed
    q.take_all(9 * MS)
    q.advance(13 * MS)
    assert q.n.rto_events == 3 and q.failed
    assert qplib.dl.qp_req_next_len(q.buf) == 0
    q.close()


def test_messages_are_posted_as_the_caller_raises_the_limit(qplib: QpLib) -> None:
    """A QP made with iters 1 sends one message; qp_req_post_upto posts more (a collective
    posts each chunk when its data is ready), never fewer, and within the send queue."""
    q = Requester(qplib, msg_size=1024, iters=1, tx_depth=2)
    assert [h.psn for h in q.take_all()] == [0]
    qplib.dl.qp_req_post_upto(q.buf, 4, 0)
    assert [h.psn for h in q.take_all()] == [1]            # tx_depth 2: two outstanding
    qplib.dl.qp_req_post_upto(q.buf, 3, 0)                 # lower: nothing changes
    q.receive(opcode=0x11, psn=1, syndrome=0x1F)
    assert [h.psn for h in q.take_all()] == [2, 3] and q.n.messages_posted == 4
    q.close()


def test_an_answer_before_the_first_psn_is_stale(qplib: QpLib) -> None:
    """An ACK or NAK naming the PSN just before the QP's first (a late answer to an earlier
    QP on the same QPN) neither completes nor rewinds anything."""
    q = Requester(qplib, msg_size=1024, tx_depth=2, start_psn=100)
    q.take_all()
    q.receive(opcode=0x11, psn=99, syndrome=0x1F)
    q.receive(opcode=0x11, psn=99, syndrome=0x60)
    assert (q.n.messages_completed, q.n.acks_received, q.n.naks_received) == (0, 0, 0)
    assert q.take() is None                                # no go-back either
    q.receive(opcode=0x11, psn=100, syndrome=0x1F)
    assert q.n.messages_completed == 1
    q.close()


def test_a_cnp_cuts_the_dcqcn_rate(qplib: QpLib) -> None:
    """With cc_dcqcn a CNP lowers the pacing rate; without, it is only counted."""
    for cc in (1, 0):
        q = Requester(qplib, cc_dcqcn=cc)
        q.receive(opcode=0x81, now=MS)
        assert q.n.cnps_received == 1
        rate = qplib.dl.qp_req_rate_bps(q.buf)
        assert rate < LINE if cc else rate == LINE
        q.close()


def responder(qplib: QpLib, interval_ns: int = 10 * MS) -> ctypes.Array:
    r = ctypes.create_string_buffer(qplib.resp_size)
    qplib.dl.qp_resp_init(r, 0x101, 0x100, PSN_SPACE - 2, interval_ns)
    return r


def deliver(qplib: QpLib, r: ctypes.Array, psn: int, *, ackreq: int = 0, ce: int = 0,
            now: int = 0, opcode: int = 0x07) -> None:
    h = Hdr(opcode=opcode, dqpn=0x101, psn=psn, ackreq=ackreq)
    qplib.dl.qp_resp_on_data(r, ctypes.byref(h), 1024, 1122, ce, now)


def answer(qplib: QpLib, r: ctypes.Array) -> tuple[int, int] | None:
    """(syndrome, PSN) of the ACK/NAK owed, or None."""
    h = Hdr()
    return (h.syndrome, h.psn) if qplib.dl.qp_resp_response(r, ctypes.byref(h)) else None


def test_the_responder_naks_a_gap_once_and_reacks_duplicates(qplib: QpLib) -> None:
    """In order: accepted, one ACK for the latest PSN; a gap: dropped and one NAK for the
    expected PSN, none for later packets of the same gap; a duplicate: ACK of e - 1."""
    r = responder(qplib)
    n = RespCounters.from_buffer(r, qplib.resp_n)
    deliver(qplib, r, PSN_SPACE - 2, opcode=0x06)
    deliver(qplib, r, PSN_SPACE - 1, ackreq=1)
    deliver(qplib, r, 0, ackreq=1)
    assert answer(qplib, r) == (0x1F, 0) and answer(qplib, r) is None   # coalesced
    deliver(qplib, r, 2)                                    # PSN 1 lost
    assert answer(qplib, r) == (0x60, 1)
    for psn in (3, 4):
        deliver(qplib, r, psn, ackreq=1)
    assert answer(qplib, r) is None                         # one NAK per gap
    deliver(qplib, r, PSN_SPACE - 1)                        # an old duplicate
    assert answer(qplib, r) == (0x1F, 0)
    deliver(qplib, r, 1)
    deliver(qplib, r, 2, ackreq=1, opcode=0x08)
    assert answer(qplib, r) == (0x1F, 2)
    assert (n.payload_bytes_received, n.out_of_sequence, n.duplicates, n.naks_sent,
            n.messages_received) == (5 * 1024, 3, 1, 1, 1)


def test_the_notification_point_sends_one_cnp_per_interval(qplib: QpLib) -> None:
    """CE on every packet: a CNP for the first, then none until the interval has passed."""
    r = responder(qplib, interval_ns=10 * MS)
    h, cnps = Hdr(), []
    for i in range(30):                                     # one packet a ms
        deliver(qplib, r, (PSN_SPACE - 2 + i) % PSN_SPACE, ce=1, now=i * MS)
        if qplib.dl.qp_resp_cnp(r, ctypes.byref(h)):
            cnps.append(i)
            assert (h.opcode, h.dqpn, h.psn) == (0x81, 0x100, 0)
    assert cnps == [0, 10, 20]
    n = RespCounters.from_buffer(r, qplib.resp_n)
    assert (n.ce_received, n.cnps_sent) == (30, 3)


def test_spraying_gives_each_packet_one_of_n_source_ports(qplib: QpLib) -> None:
    """Per QP: one port. Sprayed over N: the packets take N ports in turn (from the QPN's
    hash, or from an explicit base), which the switches' 5-tuple hash sees as N flows."""
    sport = qplib.dl.roce_udp_sport
    assert {sport(0x100, 0, seq, 0) for seq in range(64)} == {sport(0x100, 0, 0, 1)}
    sprayed = [sport(0x100, 0, seq, 8) for seq in range(16)]
    assert len(set(sprayed)) == 8 and sprayed[:8] == sprayed[8:]
    assert all(49152 <= p <= 65535 for p in sprayed)
    assert [sport(0x100, 5000, seq, 4) for seq in range(6)] == [5000, 5001, 5002, 5003,
                                                                 5000, 5001]


def test_out_of_order_placement_keeps_what_arrives_ahead(qplib: QpLib) -> None:
    """Placement ooo (NAK after 3 packets past a gap): packets ahead of a gap are placed,
    each byte counted once; reordering shorter than the threshold brings no NAK; a longer
    gap one NAK; the missing packet moves the expected PSN over everything placed, and one
    ACK says how far. The same arrivals at RC's go-back-N receiver: dropped, a NAK at once."""
    for ooo in (1, 0):
        r = responder(qplib)
        qplib.dl.qp_resp_set_placement(r, ooo, 3)
        n = RespCounters.from_buffer(r, qplib.resp_n)
        first = PSN_SPACE - 2
        deliver(qplib, r, first, opcode=0x06)
        deliver(qplib, r, 0, ackreq=1)                     # first + 1 late: reordered
        deliver(qplib, r, 1)
        first_answer = answer(qplib, r)
        if ooo:
            assert first_answer == (0x1F, first)                   # AckReq: cumulative, no NAK
            deliver(qplib, r, first + 1)                   # the late one: no NAK was owed
            assert answer(qplib, r) == (0x1F, 1)           # first + 3 wraps to 1
            assert n.naks_sent == 0 and n.placed_out_of_order == 2
            for psn in (3, 4, 5):                          # PSN 2 lost: 3 past the gap
                deliver(qplib, r, psn)
            assert answer(qplib, r) == (0x60, 2)
            deliver(qplib, r, 4)                           # a duplicate of a placed one
            deliver(qplib, r, 2, opcode=0x08)
            assert answer(qplib, r) == (0x1F, 5)
            assert (n.payload_bytes_received, n.placed_out_of_order, n.duplicates,
                    n.naks_sent, n.out_of_sequence, n.messages_received) == (
                        8 * 1024, 5, 1, 1, 0, 1)
        else:
            assert first_answer == (0x60, first + 1)                 # go-back-N: a NAK at once
            assert (n.placed_out_of_order, n.out_of_sequence) == (0, 2)
