"""Packet-out checksum repair, checked against os-ken's own packet serialiser."""

import pytest

pytest.importorskip("os_ken")

from os_ken.lib.packet import ethernet, ipv4, packet, tcp, udp

from controllers.checksum import fix_checksums


def frame(l4, payload=b""):
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(dst="00:00:00:00:00:05", src="00:00:00:00:00:01",
                                       ethertype=0x0800))
    pkt.add_protocol(ipv4.ipv4(src="10.0.0.1", dst="10.0.0.5",
                               proto=6 if isinstance(l4, tcp.tcp) else 17))
    pkt.add_protocol(l4)
    if payload:
        pkt.add_protocol(payload)
    pkt.serialize()
    return bytes(pkt.data)


@pytest.mark.parametrize("l4, payload", [
    (tcp.tcp(src_port=40000, dst_port=5201, seq=7, bits=tcp.TCP_SYN, window_size=42340,
             option=[tcp.TCPOptionMaximumSegmentSize(max_seg_size=1460)]), b""),
    (tcp.tcp(src_port=1, dst_port=2, seq=1, ack=2, bits=tcp.TCP_ACK), b"x" * 101),
    (udp.udp(src_port=5000, dst_port=5201), b"hello world"),
])
def test_broken_checksums_are_repaired(l4, payload):
    good = frame(l4, payload)
    broken = bytearray(good)
    l4_csum = 14 + 20 + (16 if isinstance(l4, tcp.tcp) else 6)
    broken[l4_csum:l4_csum + 2] = b"\x14\x34"     # a partial (offload) checksum
    broken[24:26] = b"\x00\x00"                   # and no IPv4 header checksum
    assert fix_checksums(bytes(broken)) == good


def test_non_ip_frames_are_untouched():
    arp = b"\xff" * 6 + b"\x00" * 6 + b"\x08\x06" + b"\x00" * 28
    assert fix_checksums(arp) == arp
