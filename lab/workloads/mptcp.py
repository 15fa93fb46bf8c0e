"""MPTCP connections between the lab's hosts: the kernel's path manager set up in their
namespaces, and each connection's subflows found on the wire.

Why the subflows join at ports: the lab's hosts have one address each, so subflows from
extra addresses (MPTCP's usual multihoming) are not there to open. The in-kernel path
manager can instead announce the receiver's one address several times, each with a port
of its own (a ``signal`` endpoint with a port, ADD_ADDR with a port on the wire); the
sender opens one subflow to each. Every subflow then has its own 5-tuple, which a switch
hashing 5-tuples places on its own path, as it would place subflows from several addresses.

An application is made MPTCP by ``mptcpize`` (mptcpd's LD_PRELOAD wrapper: its TCP sockets
become IPPROTO_MPTCP), so iperf3 runs unmodified.

A joined subflow's source port is the sender's kernel's choice, known only once it is up:
the run finds each connection's subflows with ``ss`` (grouped by the connection's token)
before its measurement window opens, and watches them like planned flows.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from lab.machine.programs import ready_timeout_s
from lab.model.errors import MachineError
from lab.model.flows import MPTCP_JOIN_PORT, MPTCP_MAX_SUBFLOWS, FlowSpec

#: The sysctl that exists only on a kernel built with MPTCP (CONFIG_MPTCP).
SYSCTL = "net.mptcp.enabled"
#: What makes an unmodified program speak MPTCP (its TCP sockets become IPPROTO_MPTCP).
WRAPPER = ["mptcpize", "run"]


def unavailable() -> str | None:
    """Why this machine cannot run MPTCP flows, naming what is missing; None if it can.

    Only the sysctl's presence counts: every new namespace starts with MPTCP enabled,
    whatever the machine's own namespace has it set to.
    """
    path = Path("/proc/sys") / SYSCTL.replace(".", "/")
    if not path.exists():
        return f"this kernel has no MPTCP (no sysctl {SYSCTL}: built without CONFIG_MPTCP)"
    if shutil.which(WRAPPER[0]) is None:
        return "mptcpize is not installed (Debian package mptcpd; run: make setup)"
    return None


def join_ports(subflows: int) -> list[int]:
    """The ports a receiver announces for a connection of ``subflows`` subflows."""
    return [MPTCP_JOIN_PORT + k for k in range(subflows - 1)]


def host_commands(flows: Iterable[FlowSpec]) -> dict[str, list[str]]:
    """Per host, the ``ip mptcp`` commands that give ``flows`` their subflows.

    A receiver announces its address at every join port and accepts no announcements;
    a sender accepts as many as its connections need. ``subflows`` limits the subflows
    *added* to a connection (its first one not counted), on either side.
    """
    extra_out: dict[str, int] = {}
    extra_in: dict[str, tuple[str, int]] = {}
    for f in flows:
        if f.subflows > 1:
            extra_out[f.src] = max(extra_out.get(f.src, 0), f.subflows - 1)
            prev = extra_in.get(f.dst, (f.dst_ip, 0))[1]
            extra_in[f.dst] = (f.dst_ip, max(prev, f.subflows - 1))
    cmds: dict[str, list[str]] = {}
    for host in sorted(set(extra_out) | set(extra_in)):
        ip, n_in = extra_in.get(host, ("", 0))
        n_out = extra_out.get(host, 0)
        cmds[host] = [f"ip mptcp endpoint add {ip} port {p} signal"
                      for p in join_ports(n_in + 1)]
        cmds[host].append(f"ip mptcp limits set add_addr_accepted {n_out} "
                          f"subflows {max(n_in, n_out)}")
    return cmds


def mesh_limits(ips: dict[str, str]) -> dict[str, list[str]]:
    """Per host of ``ips`` ({host: address}), the path manager's limits for a mesh whose
    connections run in any direction (:func:`mesh_announce`), set before they open.

    Each end accepts the peer's announcements, and a connection may hold the path
    manager's most subflows: joins from both ends cross, and at a limit of exactly their
    count they were refused (measured: a third of them). An announcement the peer did not
    echo is sent again after a second, not the default two minutes, so that a join it
    brings is up before the window opens. What an earlier phase set is flushed first.
    """
    return {h: ["ip mptcp endpoint flush", "sysctl -qw net.mptcp.add_addr_timeout=1",
                f"ip mptcp limits set add_addr_accepted {MPTCP_MAX_SUBFLOWS} "
                f"subflows {MPTCP_MAX_SUBFLOWS}"]
            for h in sorted(ips)}


def mesh_announce(ips: dict[str, str], subflows: int) -> dict[str, list[str]]:
    """Per host, the join ports it announces on every connection it already has, for
    connections of ``subflows`` subflows (odd) in any direction among ``ips``.

    A library such as gloo decides who connects to whom only at rendezvous, so every host
    announces and accepts, and each end announces half the extra subflows: the peer opens
    one join to each, so a connection has 1 + 2 x half subflows, whoever opened it. They
    are announced once the connections are up, because a join the passive end opens
    before it counts its connection as fully established fails (measured: with the ports
    announced beforehand, one in three connections got no join from its passive end).
    """
    half = (subflows - 1) // 2
    return {h: [f"ip mptcp endpoint add {ip} port {p} signal" for p in join_ports(half + 1)]
            for h, ip in sorted(ips.items())}


def configure(fabric: Any, flows: Iterable[FlowSpec]) -> None:
    """Set the path manager up in the hosts' namespaces (gone with them at the end)."""
    apply(fabric, host_commands(flows))


def apply(fabric: Any, commands: dict[str, list[str]]) -> None:
    """Run each host's ``ip mptcp`` commands in its namespace; the first that fails raises."""
    for host, cmds in commands.items():
        for cmd in cmds:
            out = str(fabric.host(host).cmd(f"{cmd} 2>&1 && echo ok")).strip()
            if not out.endswith("ok"):
                raise MachineError("mptcp", f"{host}: {cmd}: {out}")


#: A socket line of ``ss``, with its State column or without it (``ss state X`` omits it):
#: Recv-Q, then the two ends.
_SOCKET = re.compile(r"^(?:[A-Z][A-Z-]*\s+)?(\d+)\s+\d+\s+([\d.]+):(\d+)\s+([\d.]+):(\d+)")
_TOKEN = re.compile(r"token:[0-9a-f]+\(id:\d+\)/([0-9a-f]+)\(id:\d+\)")


def parse_subflows(ss_text: str) -> list[tuple[str, int, str, int, str]]:
    """(local ip, local port, peer ip, peer port, connection token) of every MPTCP subflow
    in ``ss -tniH`` output: a socket line, then its indented details, whose
    ``tcp-ulp-mptcp`` part ends in the local token of the connection it belongs to."""
    return [(ip, port, pip, pport, token)
            for ip, port, pip, pport, token, _ in _subflow_lines(ss_text)]


def held_by_subflows(ss_text: str) -> list[tuple[str, int, str, int, int]]:
    """(local ip, local port, peer ip, peer port, bytes) of every MPTCP subflow in
    ``ss -tniH`` output with bytes in its receive queue: bytes its connection has not
    taken in, which the connection's reader therefore cannot have."""
    return [(ip, port, pip, pport, held)
            for ip, port, pip, pport, _, held in _subflow_lines(ss_text) if held]


def _subflow_lines(ss_text: str) -> list[tuple[str, int, str, int, str, int]]:
    """Every MPTCP subflow's ends, connection token and receive queue in ``ss`` output."""
    out = []
    sock: tuple[str, int, str, int, int] | None = None
    for line in ss_text.splitlines():
        m = _SOCKET.match(line)
        if m:
            sock = (m[2], int(m[3]), m[4], int(m[5]), int(m[1]))
            continue
        t = _TOKEN.search(line)
        if sock is not None and t:
            out.append((*sock[:4], t[1], sock[4]))
            sock = None
    return out


def joined(flow: FlowSpec, found: list[tuple[str, int, str, int, str]]) -> list[FlowSpec]:
    """``flow``'s joined subflows among ``found``, as flows to watch: the subflows with the
    token of the one bound to ``flow``'s own source port, that one excluded; by port."""
    token = next((t for ip, port, _, _, t in found
                  if ip == flow.src_ip and port == flow.sport), None)
    if token is None:
        return []
    subs = sorted((pport, lport) for ip, lport, pip, pport, t in found
                  if t == token and pip == flow.dst_ip and lport != flow.sport)
    return [replace(flow, id=f"{flow.id}~{k + 1}", sport=lport, dport=pport, rate_bps=0.0,
                    subflows=1, subflow_of=flow.id, result={})
            for k, (pport, lport) in enumerate(subs)]


def host_sockets(fabric: Any, host: str) -> str:
    """``host``'s established TCP sockets with their details (``ss -tniH``): what its MPTCP
    subflows are read from."""
    return str(fabric.host(host).cmd("ss -tniH state established"))


def wait_subflows(fabric: Any, flows: list[FlowSpec], timeout_s: float | None = None,
                  poll_s: float = 0.05, settle_s: float | None = None) -> list[FlowSpec]:
    """Every MPTCP flow's joined subflows, once each has all of them up.

    Raises when some connection is still short of subflows after ``timeout_s`` (default
    the machine's ready time): the run would otherwise measure fewer paths than it says.

    ``settle_s``: joins opened from both ends (:func:`mesh_announce`) are not all made:
    the kernel drops some announcements it is busy for (``AddAddrDrop``; measured: 0-11 %
    of the joins of gloo's 56 connections, 22 runs) and never opens those joins later.
    Then what is up once nothing has changed for ``settle_s`` is what the connections
    have, whatever their count: every subflow that exists is watched from before its
    first byte of the job.
    """
    wanted = [f for f in flows if f.subflows > 1]
    deadline = time.monotonic() + (ready_timeout_s() if timeout_s is None else timeout_s)
    last: dict[str, list[FlowSpec]] = {}
    since = time.monotonic()
    while True:
        found: dict[str, list[tuple[str, int, str, int, str]]] = {}
        for src in sorted({f.src for f in wanted}):
            found[src] = parse_subflows(host_sockets(fabric, src))
        subs = {f.id: joined(f, found[f.src]) for f in wanted}
        if subs != last:
            last, since = subs, time.monotonic()
        short = [f"{f.id} ({len(subs[f.id]) + 1} of {f.subflows})" for f in wanted
                 if len(subs[f.id]) < f.subflows - 1]
        settled = settle_s is not None and time.monotonic() - since >= settle_s
        if not short or settled:
            return [s for f in wanted for s in subs[f.id]]
        if time.monotonic() > deadline:
            raise MachineError("mptcp", "connections without all their subflows: "
                               + ", ".join(short))
        time.sleep(poll_s)
