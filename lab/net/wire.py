"""Ports that count wire bytes: the lab's size table on each shaped port's root qdisc.

tc cannot load an arbitrary size table (its ``stab`` only computes ATM and ADSL cells), so
the table (``controllers.marking.wire_size_table``) goes to the kernel as rtnetlink's
``TCA_STAB`` on a change of the root qdisc, over one socket per network namespace
(``lab.machine.netns``: nothing is spawned per port). A change that carries no options
keeps every other setting of the qdisc and its classes.
"""

from __future__ import annotations

import functools
import os
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from controllers.marking import wire_size_table
from lab.machine.netns import socket_in
from lab.model.errors import TopologyError

_NLMSG_HDR = struct.Struct("=IHHII")          # len, type, flags, seq, pid
_TCMSG = struct.Struct("=BxxxiIII")           # family, ifindex, handle, parent, info
_SIZESPEC = struct.Struct("=BBhiIIII")        # cell_log, size_log, cell_align, overhead,
#                                               linklayer, mpu, mtu, tsize
_RTM_NEWQDISC, _NLMSG_ERROR = 36, 2
_NLM_F_REQUEST, _NLM_F_ACK = 0x1, 0x4
_TCA_KIND, _TCA_STAB = 1, 8
_TCA_STAB_BASE, _TCA_STAB_DATA = 1, 2
_NLA_F_NESTED = 0x8000
_TC_LINKLAYER_ETHERNET = 1
#: tc's parent for a root qdisc.
TC_H_ROOT = 0xFFFFFFFF


@dataclass(frozen=True)
class Qdisc:
    """A qdisc of a port that gets the table: where it hangs, its handle and its kind."""

    dev: str
    parent: int = TC_H_ROOT
    handle: int = 0x00010000          # the htb every shaped port has (lab/net/links.py)
    kind: str = "htb"


def _attr(kind: int, payload: bytes) -> bytes:
    body = struct.pack("=HH", 4 + len(payload), kind) + payload
    return body + b"\0" * (-len(body) % 4)


@functools.cache
def _stab_attr() -> bytes:
    """``TCA_STAB`` for the wire table, built once: slot n is a packet of n bytes."""
    table = wire_size_table()
    spec = _SIZESPEC.pack(0, 0, 0, 0, _TC_LINKLAYER_ETHERNET, 0, 0, len(table))
    data = struct.pack(f"={len(table)}H", *table)
    return _attr(_TCA_STAB | _NLA_F_NESTED,
                 _attr(_TCA_STAB_BASE, spec) + _attr(_TCA_STAB_DATA, data))


def _request(ifindex: int, q: Qdisc, seq: int) -> bytes:
    body = (_TCMSG.pack(socket.AF_UNSPEC, ifindex, q.handle, q.parent, 0)
            + _attr(_TCA_KIND, q.kind.encode() + b"\0") + _stab_attr())
    return _NLMSG_HDR.pack(_NLMSG_HDR.size + len(body), _RTM_NEWQDISC,
                           _NLM_F_REQUEST | _NLM_F_ACK, seq, 0) + body


def count_wire_bytes(pid: int | None, qdiscs: Iterable[Qdisc]) -> None:
    """Give each of ``qdiscs`` (in ``pid``'s namespace, this one's for None) the wire size
    table; the first refusal is a TopologyError naming the port."""
    devs = list(qdiscs)
    if not devs:
        return
    box: dict[str, tuple[str, int, str]] = {}

    def work() -> socket.socket:
        # Runs inside the namespace: device names resolve there.
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        sock.settimeout(10.0)
        sock.bind((0, 0))
        for seq, q in enumerate(devs, start=1):
            dev = q.dev
            try:
                sock.send(_request(socket.if_nametoindex(dev), q, seq))
                reply = sock.recv(1 << 16)
            except OSError as e:
                box["error"] = (dev, e.errno or 0, str(e))
                break
            _, kind, _, _, _ = _NLMSG_HDR.unpack_from(reply, 0)
            (err,) = struct.unpack_from("=i", reply, _NLMSG_HDR.size)
            if kind == _NLMSG_ERROR and err != 0:
                box["error"] = (dev, -err, os.strerror(-err))
                break
        return sock

    socket_in(pid, work).close()
    if "error" in box:
        dev, _, why = box["error"]
        raise TopologyError("link", f"{dev}: the kernel refused the wire size table: {why}")
