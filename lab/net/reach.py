"""All-pairs reachability from one process: a raw ICMP socket in every host's namespace.

Every host pings every other once, as Mininet's ``pingAll`` does, but no ``ping`` process is
started: the lab opens one raw ICMP socket inside each host's namespace
(:func:`lab.machine.netns.socket_in`) and sends and collects all echoes itself. A fat-tree
k=8 has 16,256 pairs; one ``ping`` each, eight at a time per host, kept both cores busy for
a minute and lost 87-97 % of them to the scheduling, not to the fabric. Here the cost is the
packets' own.

Echoes leave in waves of ``WINDOW`` per host with the replies read in between, so a switch
port's queue never sees more than a wave at once. A pair lost in the first round is pinged
once more after it: its first packet may have met every other pair's first packets at the
switches' flow setup, which says nothing about whether the fabric connects the two.
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import time
from collections.abc import Iterable
from typing import Any

from lab.machine.netns import socket_in

#: Echo requests a host has in flight at once.
WINDOW = 8
_ICMP_ECHO_REQUEST, _ICMP_ECHO_REPLY = 8, 0
_ECHO = struct.Struct("!BBHHH")              # type, code, checksum, identifier, sequence
_PAYLOAD = struct.Struct("!HH")              # source index, target index
_RCVBUF = 1 << 20


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def echo_request(ident: int, src: int, dst: int) -> bytes:
    """An ICMP echo request whose payload says which pair it tests."""
    payload = _PAYLOAD.pack(src, dst)
    head = _ECHO.pack(_ICMP_ECHO_REQUEST, 0, 0, ident, dst & 0xFFFF)
    return _ECHO.pack(_ICMP_ECHO_REQUEST, 0, _checksum(head + payload), ident,
                      dst & 0xFFFF) + payload


def echo_reply_pair(packet: bytes, ident: int) -> tuple[int, int] | None:
    """(source index, target index) of one of our echo replies (an IPv4 packet as a raw
    socket reads it), or None for any other ICMP message."""
    if len(packet) < 20:
        return None
    ihl = (packet[0] & 0x0F) * 4
    icmp = packet[ihl:]
    if len(icmp) < _ECHO.size + _PAYLOAD.size:
        return None
    kind, _, _, rid, _ = _ECHO.unpack_from(icmp)
    if kind != _ICMP_ECHO_REPLY or rid != ident:
        return None
    return _PAYLOAD.unpack_from(icmp, _ECHO.size)


def _raw_icmp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
    s.setblocking(False)
    return s


def _round(socks: list[socket.socket], ips: list[str], pairs: Iterable[tuple[int, int]],
           ident: int, timeout_s: float) -> set[tuple[int, int]]:
    """Ping ``pairs`` (source, target index); the pairs that got no reply."""
    todo: dict[int, list[int]] = {}
    for src, dst in pairs:
        todo.setdefault(src, []).append(dst)
    waiting: set[tuple[int, int]] = set()
    sent_at: dict[tuple[int, int], float] = {}
    lost: set[tuple[int, int]] = set()
    in_flight = [0] * len(socks)
    sel = selectors.DefaultSelector()
    for i in todo:
        sel.register(socks[i], selectors.EVENT_READ, i)
    try:
        while todo or waiting:
            now = time.monotonic()
            for src in list(todo):
                while todo[src] and in_flight[src] < WINDOW:
                    dst = todo[src].pop()
                    try:
                        socks[src].sendto(echo_request(ident, src, dst), (ips[dst], 0))
                        waiting.add((src, dst))
                        sent_at[(src, dst)] = now
                        in_flight[src] += 1
                    except OSError:
                        lost.add((src, dst))
                if not todo[src]:
                    del todo[src]
            for key, _ in sel.select(timeout=0.01):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                while True:
                    try:
                        packet = sock.recv(2048)
                    except BlockingIOError:
                        break
                    pair = echo_reply_pair(packet, ident)
                    if pair is not None and pair[0] == key.data and pair in waiting:
                        waiting.discard(pair)
                        in_flight[pair[0]] -= 1
            now = time.monotonic()
            for pair in [p for p in waiting if now - sent_at[p] > timeout_s]:
                waiting.discard(pair)
                in_flight[pair[0]] -= 1
                lost.add(pair)
    finally:
        sel.close()
    return lost


def ping_all(hosts: list[Any], timeout_s: float = 1.0,
             ips: list[str] | None = None) -> float:
    """Every host pings every other once (a lost pair once more); the loss in per cent.

    ``hosts`` are Mininet hosts: their ``pid`` names the namespace, ``IP()`` the target,
    unless ``ips`` names each host's target address (another network's, e.g. management).
    """
    if len(hosts) < 2:
        return 0.0
    ips = [h.IP() for h in hosts] if ips is None else list(ips)
    socks = [socket_in(h.pid, _raw_icmp) for h in hosts]
    ident = os.getpid() & 0xFFFF
    try:
        pairs = [(i, j) for i in range(len(hosts)) for j in range(len(hosts)) if i != j]
        lost = _round(socks, ips, pairs, ident, timeout_s)
        if lost:
            lost = _round(socks, ips, sorted(lost), ident, timeout_s)
    finally:
        for s in socks:
            s.close()
    return 100.0 * len(lost) / len(pairs)
