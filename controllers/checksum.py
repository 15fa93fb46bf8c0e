"""Recompute IPv4/TCP/UDP checksums of a frame the controller sends back out (packet-out).

Hosts hand packets to veths with checksum offload, so a packet's L4 checksum is often only
partial while it crosses the fabric; the datapath carries the "checksum still to do" flag
with the packet, but a copy sent to the controller (packet-in) and back (packet-out) loses
it. The receiving host then drops the packet as corrupt - measured here: every first SYN of a
reactively routed flow was lost, costing each connection a 1 s retransmission timeout per
direction. Fixing the bytes before packet-out removes that.
"""

from __future__ import annotations

import struct

ETH_HLEN = 14
ETH_P_IP = 0x0800
IPPROTO_TCP, IPPROTO_UDP = 6, 17
_CSUM_OFFSET = {IPPROTO_TCP: 16, IPPROTO_UDP: 6}


def ones_complement_sum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def fix_checksums(frame: bytes) -> bytes:
    """``frame`` with correct IPv4 header and TCP/UDP checksums; other frames unchanged."""
    if len(frame) < ETH_HLEN + 20 or struct.unpack_from("!H", frame, 12)[0] != ETH_P_IP:
        return frame
    buf = bytearray(frame)
    ihl = (buf[ETH_HLEN] & 0x0F) * 4
    total_len = struct.unpack_from("!H", buf, ETH_HLEN + 2)[0]
    if ihl < 20 or len(buf) < ETH_HLEN + total_len or total_len < ihl:
        return frame
    struct.pack_into("!H", buf, ETH_HLEN + 10, 0)
    struct.pack_into("!H", buf, ETH_HLEN + 10,
                     ~ones_complement_sum(bytes(buf[ETH_HLEN:ETH_HLEN + ihl])) & 0xFFFF)
    proto = buf[ETH_HLEN + 9]
    frag = struct.unpack_from("!H", buf, ETH_HLEN + 6)[0] & 0x1FFF
    if proto not in _CSUM_OFFSET or frag:
        return bytes(buf)
    l4 = ETH_HLEN + ihl
    l4_len = total_len - ihl
    csum_at = l4 + _CSUM_OFFSET[proto]
    if l4_len < _CSUM_OFFSET[proto] + 2:
        return bytes(buf)
    struct.pack_into("!H", buf, csum_at, 0)
    pseudo = bytes(buf[ETH_HLEN + 12:ETH_HLEN + 20]) + struct.pack("!BBH", 0, proto, l4_len)
    csum = ~ones_complement_sum(pseudo + bytes(buf[l4:l4 + l4_len])) & 0xFFFF
    if proto == IPPROTO_UDP and csum == 0:
        csum = 0xFFFF
    struct.pack_into("!H", buf, csum_at, csum)
    return bytes(buf)
