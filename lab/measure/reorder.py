"""TCP's own reordering counters, read in the hosts' network namespaces over a window.

Spraying packets over paths, MPTCP's subflows and adaptive routing all trade hash
collisions for reordering: a flow's packets no longer arrive in the order they were sent.
The switches' counters cannot see that; the endpoints' kernels can. Each namespace keeps
``netstat -s``'s MIB (``/proc/net/netstat``, section ``TcpExt``), and the difference of
two reads is what the window cost TCP:

- at the data's **receiver**: ``TCPOFOQueue``, segments that arrived out of order and
  waited in the out-of-order queue (the receiver's view of reordering and of loss);
- at the data's **sender**, from what the receiver's ACKs say: ``TCPSACKReorder``,
  ``TCPTSReorder`` and ``TCPRenoReorder`` (reordering detected from SACK blocks,
  timestamps, or duplicate ACKs without SACK), ``TCPDSACKRecv`` (a duplicate SACK: a
  retransmission that was not needed) and ``TCPSpuriousRTOs`` (a timeout undone).

A flow's reordering is therefore counted at both of its ends, so both are read. The file
is read by a command inside the host's namespace (``/proc/net`` shows the namespace of the
reading process), and parsed here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lab.model.errors import MachineError

#: The counters kept, in ``TcpExt``'s own names.
COUNTERS = ("TCPSACKReorder", "TCPTSReorder", "TCPRenoReorder", "TCPDSACKRecv",
            "TCPSpuriousRTOs", "TCPOFOQueue")

Counters = dict[str, int]


def parse_netstat(text: str, section: str = "TcpExt") -> Counters:
    """{name: value} of one section of ``/proc/net/netstat``.

    The file is pairs of lines, ``Section: name name ...`` then ``Section: value value
    ...``; a section's names and values must pair up one to one, or the text is not that
    file (a truncated read, a shell's noise) and a ValueError says so.
    """
    lines = [ln.split() for ln in text.splitlines() if ln.strip()]
    head = f"{section}:"
    rows = [ln for ln in lines if ln[0] == head]
    if len(rows) != 2:
        raise ValueError(f"{len(rows)} lines of section {section} (a names line and a values "
                         "line expected)")
    names, values = rows[0][1:], rows[1][1:]
    if len(names) != len(values):
        raise ValueError(f"section {section}: {len(names)} names but {len(values)} values")
    try:
        return {n: int(v) for n, v in zip(names, values, strict=True)}
    except ValueError:
        raise ValueError(f"section {section}: a value is not an integer") from None


def delta(before: Mapping[str, int], after: Mapping[str, int],
          names: Iterable[str] = COUNTERS) -> Counters:
    """What each of ``names`` counted between two reads of one namespace.

    A counter the kernel does not have is 0 in both. The kernel's counters only grow while
    the namespace lives, so one that went down means the two reads are not of the same
    namespace: a ValueError, not a negative count.
    """
    out = {n: after.get(n, 0) - before.get(n, 0) for n in names}
    backwards = [n for n, v in out.items() if v < 0]
    if backwards:
        raise ValueError(f"counters went down between two reads: {', '.join(backwards)}")
    return out


def read(host: Any) -> Counters:
    """The ``TcpExt`` section of ``host``'s namespace (a Mininet node: ``cmd`` runs a
    command in its shell)."""
    text = host.cmd("cat /proc/net/netstat")
    try:
        return parse_netstat(text)
    except ValueError as exc:
        raise MachineError("reorder", f"{host.name}: /proc/net/netstat: {exc}") from None


class Reordering:
    """The counters of ``hosts`` (name -> node) between ``open`` and ``close``: call them
    where a measurement window opens and closes, so both describe the same seconds."""

    def __init__(self, hosts: Mapping[str, Any], senders: Iterable[str],
                 receivers: Iterable[str]) -> None:
        self.hosts = dict(hosts)
        self.senders = sorted(set(senders))
        self.receivers = sorted(set(receivers))
        self.before: dict[str, Counters] = {}
        self.after: dict[str, Counters] = {}

    def open(self) -> None:
        """Read every host before the traffic starts."""
        self.before = {name: read(h) for name, h in self.hosts.items()}

    def close(self) -> None:
        """Read them again once the traffic is over."""
        self.after = {name: read(h) for name, h in self.hosts.items()}

    def report(self) -> dict[str, Any]:
        """``sum`` over the hosts and ``per_host`` of :data:`COUNTERS` over the window, with
        which hosts sent the data and which received it."""
        per_host = {name: delta(self.before[name], self.after[name]) for name in self.hosts}
        total = {n: sum(c[n] for c in per_host.values()) for n in COUNTERS}
        return {"sum": total, "per_host": per_host, "senders": self.senders,
                "receivers": self.receivers}


def tcp_ends(flows: Iterable[Any]) -> tuple[list[str], list[str]]:
    """(senders, receivers) of the TCP flows (``FlowSpec``-like: ``proto``, ``src``,
    ``dst``)."""
    tcp = [f for f in flows if f.proto == "tcp"]
    return sorted({f.src for f in tcp}), sorted({f.dst for f in tcp})
