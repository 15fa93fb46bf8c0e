"""Interface counters and qdisc statistics over rtnetlink, from inside this process.

One socket per network namespace, kept open for the whole run: a link dump and a qdisc
dump per sample. Spawning ``tc`` per sample (as the lab once did) costs a process start
10-25 times a second, which a software-emulated machine (QEMU TCG) cannot afford: the
spawns alone used up the CPU headroom a run's fidelity check asks for.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from controllers.marking import QUEUE_HANDLE, tc_major
from lab.machine.netns import netns_inode, socket_in

_NLMSG_HDR = struct.Struct("=IHHII")        # len, type, flags, seq, pid
_NLA_HDR = struct.Struct("=HH")             # len, type
_TCMSG = struct.Struct("=BxxxiIII")         # family, ifindex, handle, parent, info
_IFINFOMSG = struct.Struct("=BxHiII")       # family, type, ifindex, flags, change
_GNET_QUEUE = struct.Struct("=IIIII")       # qlen, backlog, drops, requeues, overlimits
_LINK_STATS64 = struct.Struct("=8Q")        # rx/tx packets, rx/tx bytes, errors, dropped
_RTMSG = struct.Struct("=BBBBBBBBI")        # family, dst_len, src_len, tos, table, proto,
                                            # scope, type, flags
_RTNEXTHOP = struct.Struct("=HBBi")         # len, flags, hops, ifindex
NLMSG_ERROR, NLMSG_DONE, NLM_F_DUMP_INTR = 2, 3, 0x10
TCA_STATS2, TCA_STATS_QUEUE = 7, 3
IFLA_IFNAME, IFLA_OPERSTATE, IFLA_STATS64 = 3, 16, 23
IF_OPER_UP, IF_OPER_UNKNOWN = 6, 0
RTA_DST, RTA_OIF, RTA_MULTIPATH, RTA_TABLE, RT_TABLE_MAIN = 1, 4, 9, 15, 254
#: ``ifi_flags`` of an interface set up and running (IFF_UP | IFF_RUNNING).
IFF_RUNNING_UP = 0x1 | 0x40
TC_H_ROOT = 0xFFFFFFFF                      # a root qdisc's parent
BYTE_QUEUE_HANDLE = tc_major(QUEUE_HANDLE)  # the byte queue of every lab link
NLA_TYPE_MASK = 0x3FFF                      # without NLA_F_NESTED / NLA_F_NET_BYTEORDER


def _align(n: int) -> int:
    return (n + 3) & ~3


def _attrs(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(type, payload start, payload end) of each netlink attribute in buf[start:end]."""
    while start + _NLA_HDR.size <= end:
        length, kind = _NLA_HDR.unpack_from(buf, start)
        if length < _NLA_HDR.size:
            return
        yield kind & NLA_TYPE_MASK, start + _NLA_HDR.size, start + length
        start += _align(length)


@dataclass(frozen=True)
class LinkCounters:
    """What the lab reads of one interface (``ip -s link``; the same as sysfs)."""

    tx_bytes: int
    tx_packets: int
    tx_dropped: int
    up: bool


class Netlink:
    """One rtnetlink socket in one network namespace, open for as long as the namespace is.

    ``pid`` None is this process's own (root) namespace; otherwise the namespace of that
    process (a Mininet node's shell), entered once by a short-lived thread - ``setns`` moves
    only the calling thread - so nothing is spawned and no other thread changes namespace.
    One dump at a time per socket (a lock): the sampler thread and the phase's own
    snapshots share it.
    """

    def __init__(self, pid: int | None = None) -> None:
        from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST
        from pyroute2.netlink.rtnl import RTM_GETLINK, RTM_GETQDISC, RTM_GETROUTE
        from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
        from pyroute2.netlink.rtnl.rtmsg import rtmsg
        from pyroute2.netlink.rtnl.tcmsg import tcmsg

        self.pid = pid
        self.ns_inode = netns_inode(pid)
        self._sock = rtnl_socket(pid)
        self._sock.settimeout(10.0)
        self._lock = threading.Lock()
        self._seq = 0
        self._names: dict[int, str] = {}
        self._requests: dict[str, bytearray] = {}
        for name, cls, kind in (("qdisc", tcmsg, RTM_GETQDISC), ("link", ifinfmsg, RTM_GETLINK),
                                ("route", rtmsg, RTM_GETROUTE)):
            msg = cls()
            msg["header"]["type"] = kind
            if name == "route":
                msg["family"] = socket.AF_INET
            msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_DUMP
            msg.encode()
            self._requests[name] = bytearray(msg.data)

    def close(self) -> None:
        self._sock.close()

    def _dump(self, what: str) -> list[tuple[int, bytes, int, int]]:
        """Every message of one dump as (type, buffer, start, end), retried once if the
        kernel says the tables changed mid-dump (as ``tc`` would print a warning)."""
        with self._lock:
            for _attempt in range(2):
                msgs, interrupted = self._dump_once(what)
                if not interrupted:
                    break
            return msgs

    def _dump_once(self, what: str) -> tuple[list[tuple[int, bytes, int, int]], bool]:
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        req = self._requests[what]
        struct.pack_into("=I", req, 8, self._seq)
        self._sock.send(req)
        msgs: list[tuple[int, bytes, int, int]] = []
        interrupted = False
        while True:
            buf, _, flags, _ = self._sock.recvmsg(1 << 18)
            if flags & socket.MSG_TRUNC:
                raise OSError(f"netlink {what} dump truncated")
            off = 0
            while off + _NLMSG_HDR.size <= len(buf):
                length, kind, mflags, seq, _ = _NLMSG_HDR.unpack_from(buf, off)
                if length < _NLMSG_HDR.size:
                    break
                if seq == self._seq:        # a reply to an earlier, abandoned dump is skipped
                    if kind == NLMSG_DONE:
                        return msgs, interrupted
                    if kind == NLMSG_ERROR:
                        (err,) = struct.unpack_from("=i", buf, off + _NLMSG_HDR.size)
                        raise OSError(-err, f"netlink {what} dump: {os.strerror(-err)}")
                    interrupted |= bool(mflags & NLM_F_DUMP_INTR)
                    msgs.append((kind, buf, off + _NLMSG_HDR.size, off + length))
                off += _align(length)

    def links(self) -> dict[str, LinkCounters]:
        """{name: counters} of every interface in the namespace; refreshes index -> name."""
        out: dict[str, LinkCounters] = {}
        names: dict[int, str] = {}
        for _, buf, start, end in self._dump("link"):
            _, _, index, ifflags, _ = _IFINFOMSG.unpack_from(buf, start)
            name, stats, oper = None, None, 0
            for kind, a, b in _attrs(buf, start + _IFINFOMSG.size, end):
                if kind == IFLA_IFNAME:
                    name = buf[a:b].split(b"\0", 1)[0].decode()
                elif kind == IFLA_OPERSTATE:
                    oper = buf[a]
                elif kind == IFLA_STATS64:
                    stats = _LINK_STATS64.unpack_from(buf, a)
            if name is None:
                continue
            names[index] = name
            if stats is not None:
                # A tunnel (gretap) detects no carrier: its state is "unknown" while it is
                # up and running, as ``ip link`` shows it.
                up = oper == IF_OPER_UP or (oper == IF_OPER_UNKNOWN
                                            and ifflags & IFF_RUNNING_UP == IFF_RUNNING_UP)
                out[name] = LinkCounters(stats[3], stats[1], stats[7], up)
        self._names = names
        return out

    def qdiscs(self) -> dict[str, tuple[int, int]]:
        """{dev: (drops, backlog bytes)} of each port's queue.

        Drops are the root qdisc's, as ``tc -s -j qdisc show`` prints them: a classful root
        (htb, or netem above htb on a link with delay) counts every drop below it. The
        backlog is the byte queue's, the leaf with handle ``10:`` where the link has one:
        under htb it equals the root's, but a root netem's backlog also holds the packets
        on its delay line (a 20 ms line at 20 Mbit/s is 50 kB), which no queue holds.
        """
        roots: dict[int, tuple[int, int]] = {}
        leaf: dict[int, int] = {}
        for _, buf, start, end in self._dump("qdisc"):
            _, index, handle, parent, _ = _TCMSG.unpack_from(buf, start)
            if parent != TC_H_ROOT and handle != BYTE_QUEUE_HANDLE:
                continue
            drops = backlog = 0
            for kind, a, b in _attrs(buf, start + _TCMSG.size, end):
                if kind == TCA_STATS2:
                    for sub, qa, _qb in _attrs(buf, a, b):
                        if sub == TCA_STATS_QUEUE:
                            _, backlog, drops, _, _ = _GNET_QUEUE.unpack_from(buf, qa)
            if parent == TC_H_ROOT:
                roots[index] = (drops, backlog)
            else:
                leaf[index] = backlog
        if any(index not in self._names for index in roots):
            self.links()
        return {self._names[i]: (d, leaf.get(i, b)) for i, (d, b) in roots.items()
                if i in self._names}

    def route_devs(self, prefix: str) -> list[str]:
        """The devices of the main table's IPv4 route to exactly ``prefix``, as ``ip route
        show exact`` names them (every nexthop's); [] when there is no such route.

        The kernel puts a route's nexthops in the route even where the routing daemon
        installed them as a nexthop object (``nexthop_compat_mode``, on by default).
        """
        net = ipaddress.IPv4Network(prefix)
        found: list[int] = []
        for _, buf, start, end in self._dump("route"):
            family, dst_len, _, _, table, _, _, _, _ = _RTMSG.unpack_from(buf, start)
            if family != socket.AF_INET or dst_len != net.prefixlen:
                continue
            dst, oifs = bytes(4), []
            for kind, a, b in _attrs(buf, start + _RTMSG.size, end):
                if kind == RTA_TABLE:
                    (table,) = struct.unpack_from("=I", buf, a)
                elif kind == RTA_DST:
                    dst = bytes(buf[a:b])
                elif kind == RTA_OIF:
                    oifs.append(struct.unpack_from("=i", buf, a)[0])
                elif kind == RTA_MULTIPATH:
                    while a + _RTNEXTHOP.size <= b:
                        length, _, _, index = _RTNEXTHOP.unpack_from(buf, a)
                        if length < _RTNEXTHOP.size:
                            break
                        oifs.append(index)
                        a += _align(length)
            if table == RT_TABLE_MAIN and dst == net.network_address.packed:
                found += oifs
        if any(i not in self._names for i in found):
            self.links()
        return sorted(self._names.get(i, f"if{i}") for i in found)


def rtnl_socket(pid: int | None, groups: int = 0) -> socket.socket:
    """A bound rtnetlink socket created inside the network namespace of ``pid``, listening
    to the notification ``groups`` (a bit mask) as well."""
    def make() -> socket.socket:
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        s.bind((0, groups))
        return s

    return socket_in(pid, make)


_root: Netlink | None = None
_in_ns: dict[int, Netlink] = {}
_registry_lock = threading.Lock()


def netlink(pid: int | None = None) -> Netlink:
    """The kept-open socket of this process's namespace, or of ``pid``'s.

    A node's socket is replaced when its pid now lives in another namespace (the pid was
    reused), and sockets of nodes that are gone are closed on the way: an open socket
    would keep a dead node's namespace alive.
    """
    global _root
    with _registry_lock:
        if pid is None:
            if _root is None:
                _root = Netlink()
            return _root
        for other, nl in list(_in_ns.items()):
            try:
                current = netns_inode(other)
            except OSError:
                current = -1
            if current != nl.ns_inode:
                nl.close()
                del _in_ns[other]
        if pid not in _in_ns:
            _in_ns[pid] = Netlink(pid)
        return _in_ns[pid]


def close_netlink(pids: Iterable[int]) -> None:
    """Close the sockets kept in these nodes' namespaces (their run is over)."""
    with _registry_lock:
        for pid in pids:
            nl = _in_ns.pop(pid, None)
            if nl is not None:
                nl.close()


def qdisc_stats(pid: int | None = None) -> dict[str, tuple[int, int]]:
    """{dev: (drops, backlog bytes)} of each root qdisc in the root namespace, or in the
    namespace of ``pid``; empty if that process (and so its namespace) is gone."""
    try:
        return netlink(pid).qdiscs()
    except (FileNotFoundError, ProcessLookupError):
        return {}
