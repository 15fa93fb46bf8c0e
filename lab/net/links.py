"""Emulated links: a veth pair whose ends are shaped by htb with a byte-limited FIFO.

Mininet's ``TCLink`` silently drops ``delay``/``loss``/``max_queue_size`` when the kernel has no
netem. Here every requested property is either applied or refused: the rate and queue come
from htb + bfifo (present in every kernel the lab supports), delay, jitter and loss only from
netem.

Qdisc layout of one link end (handles are fixed: telemetry, the ECN marker and the streaming
kind find the queue by them)::

    no delay/loss:   1: htb root ── class 1:1 (rate) ── 10: bfifo (queue_bytes)
    with netem:      2: netem root (delay/jitter/loss) ── 1: htb ── class 1:1 ── 10: bfifo

netem sits at the root, above htb, rather than as htb's leaf: netem has only a packet limit,
so as the leaf it would lose the configured byte queue. At the root it only holds packets for
their delay (its own time line, sized so that it never drops: :func:`netem_limit_packets`), and
the queue that fills, drops and marks is still the bfifo (or RED) leaf ``10:``.
"""

from __future__ import annotations

import math
import subprocess
from dataclasses import asdict, dataclass
from typing import Any

from mininet.link import Intf, Link, TCIntf

from controllers.marking import FRAME_BYTES, MAX_TSO_FRAMES, QUEUE_HANDLE, htb_class_args
from lab.machine import remote
from lab.model.errors import MachineError, TopologyError
from lab.net.wire import Qdisc, count_wire_bytes

#: What a host's TCP may keep in its own NIC's queue (TSQ, per socket): two TSO packets.
#: Linux sizes TSQ in bytes (two 64 KB packets by default), which on a real NIC is
#: microseconds; on a lab link it was 15-24 ms (measured mean 91 kB, max 148 kB behind a
#: 50 Mbit/s host port), and every ACK the host sent for its incoming traffic waited
#: behind it: a ring's hops ran at half rate for tens of milliseconds at a time.
HOST_TSQ_BYTES = 2 * MAX_TSO_FRAMES * FRAME_BYTES
#: The sysctls every lab host gets for it (set per network namespace).
HOST_TCP_SYSCTLS = f"net.ipv4.tcp_limit_output_bytes={HOST_TSQ_BYTES}"
#: The longest one-way delay (and jitter) a link may be given: a path around the planet and
#: back is ~300 ms; a second is plainly a typo for something else.
MAX_DELAY_MS = 1000.0
#: netem's time line holds what arrives during delay + jitter. Arrivals at a switch port may
#: exceed its rate (many senders into one port: that is what the queue behind is for), so the
#: line is sized for this many times the link rate, in full-size frames ...
_NETEM_FANIN = 16
_NETEM_FRAME_BYTES = 1500
#: ... and never below netem's own default.
_NETEM_MIN_LIMIT = 1000
#: Handle of the root netem when a link has delay/jitter/loss.
NETEM_HANDLE = "2:"
_NETEM_MAJOR = int(NETEM_HANDLE.rstrip(":"), 16) << 16


def wire_qdiscs(dev: str, netem: Netem | None) -> list[Qdisc]:
    """The qdiscs of a shaped port that count wire bytes (lab/net/wire.py): its htb, and a
    root netem above it too. (Measured on Debian 12's 6.1 kernel: the table on the htb below
    a netem alone left it counting frame bytes; a packet counted at the root keeps its
    length on the way down.)"""
    if netem is None or not netem.active:
        return [Qdisc(dev)]
    return [Qdisc(dev, handle=_NETEM_MAJOR, kind="netem"), Qdisc(dev, parent=_NETEM_MAJOR | 1)]


@dataclass(frozen=True)
class Netem:
    """One-way propagation delay, its jitter and random loss of one link direction.

    Jitter is netem's: each packet draws its own delay, so packets of one flow may be
    reordered (TCP sees that as loss). Use it to study exactly that, not as decoration.
    """

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0

    @property
    def active(self) -> bool:
        return bool(self.delay_ms or self.jitter_ms or self.loss_pct)

    def args(self) -> str:
        """netem's own arguments, e.g. ``delay 10ms 2ms loss 0.5%``."""
        out = []
        if self.delay_ms or self.jitter_ms:
            out.append(f"delay {self.delay_ms:g}ms" + (f" {self.jitter_ms:g}ms"
                                                       if self.jitter_ms else ""))
        if self.loss_pct:
            out.append(f"loss {self.loss_pct:g}%")
        return " ".join(out)

    def as_dict(self) -> dict[str, float]:
        return {"delay_ms": self.delay_ms, "jitter_ms": self.jitter_ms,
                "loss_pct": self.loss_pct}


def _check_number(field: str, value: object, hi: float, unit: str,
                  below_hi: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise TopologyError(field, f"expected a number of {unit}, got {value!r}")
    if value < 0 or value > hi or (below_hi and value == hi):
        bound = f"< {hi:g}" if below_hi else f"<= {hi:g}"
        raise TopologyError(field, f"{value} is out of range (0 <= {field.rsplit('.', 1)[-1]} "
                            f"{bound} {unit})")
    return float(value)


def check_netem(fields: tuple[str, str, str], delay_ms: object = 0.0,
                jitter_ms: object = 0.0, loss_pct: object = 0.0) -> Netem:
    """A ``Netem`` from user values; each bad one is a TopologyError naming its field
    (``fields`` names delay, jitter and loss as the user wrote them)."""
    f_delay, f_jitter, f_loss = fields
    delay = _check_number(f_delay, delay_ms, MAX_DELAY_MS, "ms")
    jitter = _check_number(f_jitter, jitter_ms, MAX_DELAY_MS, "ms")
    loss = _check_number(f_loss, loss_pct, 100.0, "%", below_hi=True)
    if jitter > delay:
        # netem would clamp the negative delays to 0: the link would not have the
        # distribution asked for.
        raise TopologyError(f_jitter, f"{jitter:g} ms of jitter is more than the delay "
                            f"({delay:g} ms, {f_delay}); delays cannot go below 0")
    return Netem(delay, jitter, loss)


def netem_limit_packets(bw_mbps: float | None, netem: Netem) -> int:
    """netem's packet limit: what can arrive while packets wait out delay + jitter.

    netem drops (counted at the root, indistinguishable there from queue drops) when its
    time line is full; sized for ``_NETEM_FANIN`` times the link rate in full-size frames,
    it never is, and every drop is the byte queue's.
    """
    window_s = (netem.delay_ms + netem.jitter_ms) / 1000
    rate_bytes = (bw_mbps or 1000.0) * 1e6 / 8
    return max(_NETEM_MIN_LIMIT,
               math.ceil(_NETEM_FANIN * rate_bytes * window_s / _NETEM_FRAME_BYTES))


#: ``ip link set`` arguments that cap an interface's TSO packets (``MAX_TSO_FRAMES``).
TSO_LIMIT = f"gso_max_segs {MAX_TSO_FRAMES}"
#: The same in a fabric split over machines: one frame per packet. A TSO packet that
#: crosses a tunnel leaves the worker as frames, each counted with its own headers by the
#: far switch's per-flow counters (measured: a few hundred bytes a flow more than the
#: near switch had counted); frames are counted alike on both sides.
TSO_LIMIT_CLUSTER = "gso_max_segs 1"


def tc_commands(dev: str, bw: float | None, queue_bytes: int,
                netem: Netem | None = None) -> list[str]:
    """The tc commands that give ``dev`` its layout (see the module doc), in order."""
    cmds: list[str] = []
    htb_parent = "root"
    if netem is not None and netem.active:
        cmds.append(f"tc qdisc add dev {dev} root handle {NETEM_HANDLE} netem "
                    f"limit {netem_limit_packets(bw, netem)} {netem.args()}")
        htb_parent = f"parent {NETEM_HANDLE}1"
    if bw is None:
        return cmds
    cmds += [
        f"tc qdisc add dev {dev} {htb_parent} handle 1: htb default 1",
        f"tc class add dev {dev} parent 1: classid 1:1 {htb_class_args(bw)}",
        f"tc qdisc add dev {dev} parent 1:1 handle {QUEUE_HANDLE} bfifo limit {queue_bytes}",
    ]
    return cmds


def root_netem_delay_ms(qdiscs: list[dict]) -> float | None:
    """One-way delay (ms) of the netem at a device's root, from ``tc -j qdisc show dev X``
    (iproute2 prints it in seconds); None when the root is not netem or has no delay."""
    for q in qdiscs:
        if q.get("root") and q.get("kind") == "netem":
            delay = (q.get("options") or {}).get("delay")
            if isinstance(delay, dict):
                delay = delay.get("delay")
            if isinstance(delay, int | float) and not isinstance(delay, bool) and delay > 0:
                return round(delay * 1000, 6)
            return None
    return None


class ShapedIntf(TCIntf):
    """An interface shaped to ``bw`` Mbit/s with a ``queue_bytes`` tail-drop queue, and
    optionally netem's ``delay_ms``, ``jitter_ms`` and ``loss_pct`` (layout: module doc).

    Without netem in the kernel, asking for any of them is refused (``netem_field`` names
    the value), unless ``netem_optional``: then the link has none, and whoever asked must
    read back and record what the link got (:func:`root_netem`).

    Subclasses ``TCIntf`` so that Mininet re-applies this config after OVS adds the port.
    """

    netem_available = False  # set by the lab from environment detection
    #: While set, shaping is collected here instead of applied (:class:`ShapingBatch`).
    batch: ShapingBatch | None = None
    #: What the first ``config`` under a batch returned (a re-apply returns it again).
    shaped: dict = {}  # noqa: RUF012 - replaced per instance, never mutated

    def config(self, bw: float | None = None, queue_bytes: int | None = None,
               delay_ms: float = 0.0, jitter_ms: float = 0.0, loss_pct: float = 0.0,
               netem_field: str = "link.delay_ms", netem_optional: bool = False,
               **params: object) -> dict:
        # No IPv6 on emulated links: router solicitations and MLD reports would otherwise
        # show up in the per-link byte counters that the report checks against the flows.
        batch = ShapedIntf.batch
        if batch is not None and self.name in batch.pending:
            return dict(self.shaped)          # Mininet's re-apply after OVS took the port
        disable = f"/proc/sys/net/ipv6/conf/{self.name}/disable_ipv6"
        if self.node.inNamespace or getattr(self.node, "isRemote", False):
            self.cmd(f"echo 1 > {disable}")
        else:                                 # the lab's own namespace: no shell needed
            with open(disable, "w") as f:
                f.write("1")
        if batch is None:                     # batched, the fabric's `ip -batch` caps it
            self.cmd(f"ip link set dev {self.name} {TSO_LIMIT}")
        for mininet_key in ("delay", "jitter", "loss", "max_queue_size"):
            if params.get(mininet_key) is not None:
                raise TopologyError(f"link.{mininet_key}", "not a FabricLab link parameter "
                                    "(use delay_ms, jitter_ms, loss_pct or queue_bytes)")
        if batch is not None and params.pop("up", True):
            batch.ups.append((self.node, self.name))    # set up with the whole fabric's
            params["up"] = None
        result = Intf.config(self, **params)
        netem = Netem(delay_ms, jitter_ms, loss_pct)
        if netem.active and not self.netem_available and netem_optional:
            netem = Netem()        # "where the kernel can": the caller records what it got
        if netem.active and not self.netem_available:
            raise TopologyError(netem_field, "this kernel has no netem; delay, jitter and "
                                "loss cannot be emulated here (see `fabriclab doctor`)")
        if bw is None and not netem.active:
            if batch is not None:
                self.shaped = result
                batch.add(self, [], [])
            return result
        dev = self.name
        cmds = tc_commands(dev, bw, queue_bytes or 150_000, netem)
        wire = wire_qdiscs(dev, netem) if bw is not None else []
        if batch is None:
            self._apply_now(cmds)
            count_wire_bytes(self.node.pid if self.node.inNamespace else None, wire)
        if bw is not None:
            result["bw"] = bw
        if netem.active:
            result["netem"] = netem.args()
        if batch is not None:
            self.shaped = result
            batch.add(self, cmds, wire)
        return result

    def _apply_now(self, cmds: list[str]) -> None:
        dev = self.name
        self.cmd(f"tc qdisc del dev {dev} root 2>/dev/null")
        for cmd in cmds:
            out = self.cmd(f"{cmd} 2>&1; echo __rc=$?").strip()
            text, _, rc = out.rpartition("__rc=")
            if rc.strip() != "0":
                raise TopologyError("link", f"{dev}: `{cmd}` failed: {text.strip()}")


def change_rate(node: Any, dev: str, bw_mbps: float, field: str) -> None:
    """Change a shaped port's rate in place (its htb class 1:1), keeping its queue, its
    counters and its wire-size table: a phase may run a link slower than the topology built
    it, and the counters a window reads across the change must stay one series.

    ``field`` names the scenario key that asked, for the one line a failure gives."""
    out = node.cmd(f"tc class change dev {dev} parent 1: classid 1:1 "
                   f"{htb_class_args(bw_mbps)} 2>&1; echo __rc=$?")
    text, _, rc = out.strip().rpartition("__rc=")
    if rc.strip() != "0":
        raise MachineError(field, f"{dev}: cannot set {bw_mbps:g} Mbit/s: {text.strip()}")


class ShapedLink(Link):
    """A Mininet link whose two ends are ``ShapedIntf`` with the same parameters."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("cls1", ShapedIntf)
        kwargs.setdefault("cls2", ShapedIntf)
        super().__init__(*args, **kwargs)


class ShapingBatch:
    """The shaping of a whole fabric, applied with one ``tc -batch`` per network namespace.

    Applied one command at a time through the nodes' shells, shaping was most of a large
    fabric's bring-up: four tc commands per interface end, and every switch end twice
    (Mininet re-applies it after OVS adds the port, because OVS resets a port's qdisc then).
    Measured for a fat-tree k=8 (1,536 interface ends): 54 s of its 65 s. Collected while
    the network is built and applied once after the switches have their ports, each end is
    shaped once: every switch end (all in the root namespace) by one ``tc`` process, and
    each host's ends by one command in its shell.

    Every end starts from the kernel's default qdisc (a new veth, or a port whose qdisc OVS
    has just reset), so the commands only add; a failure names the device and the command.
    """

    def __init__(self, tso_limit: str = TSO_LIMIT) -> None:
        #: What every collected interface's TSO packets are capped to when it is set up.
        self.tso_limit = tso_limit
        #: interface name -> (its node, its tc commands, its htb for the wire size table); a
        #: later config of the same interface (Mininet's re-apply) replaces the earlier one.
        self.pending: dict[str, tuple[Any, list[str], list[Qdisc]]] = {}
        #: (node, interface) to set up, all at once, before the switches take their ports.
        self.ups: list[tuple[Any, str]] = []

    def add(self, intf: ShapedIntf, cmds: list[str], wire: list[Qdisc]) -> None:
        self.pending[intf.name] = (intf.node, cmds, wire)

    def __enter__(self) -> ShapingBatch:
        ShapedIntf.batch = self
        return self

    def __exit__(self, *exc: object) -> None:
        ShapedIntf.batch = None

    def set_up(self) -> None:
        """Every collected interface up: before the switches start, so that no port is seen
        down (the controller would route around it)."""
        _run_batches("ip", [(node, f"link set dev {name} {self.tso_limit} up")
                            for node, name in self.ups])
        self.ups.clear()

    def apply(self) -> int:
        """Shape every collected interface; returns how many."""
        _run_batches("tc", [(node, c.removeprefix("tc ")) for node, cmds, _ in
                            self.pending.values() for c in cmds])
        by_ns: dict[tuple[str, int | None], list[Qdisc]] = {}
        for node, _, wire in self.pending.values():
            where = (node.name if getattr(node, "isRemote", False) else "",
                     node.pid if node.inNamespace else None)
            by_ns.setdefault(where, []).extend(wire)
        placement = remote.current()
        for (name, pid), ports in by_ns.items():
            agent = placement.agent_of(name) if placement and name else None
            if agent is None:
                count_wire_bytes(pid, ports)
            else:                 # the table goes in on the worker, over its own netlink
                agent.request("stab", entries=[[pid, [asdict(q) for q in ports]]])
        n = len(self.pending)
        self.pending.clear()
        return n


def _run_batches(tool: str, lines: list[tuple[Any, str]]) -> None:
    """``tool -batch`` once for the root namespace and once per node in a namespace of its
    own; the first failure is a TopologyError naming the command."""
    root: list[str] = []
    by_node: dict[Any, list[str]] = {}
    shell_of: dict[Any, Any] = {}
    for node, line in lines:
        if node.inNamespace:
            by_node.setdefault(node, []).append(line)
        elif getattr(node, "isRemote", False):
            # Another worker's root namespace: one batch through one of its nodes' shells.
            by_node.setdefault(shell_of.setdefault(node.server, node), []).append(line)
        else:
            root.append(line)
    if root:
        proc = subprocess.run([tool, "-batch", "-"], input="\n".join(root) + "\n",
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise TopologyError("link", _batch_failure(tool, root, proc.stderr))
    for node, mine in by_node.items():
        body = "\n".join(mine)
        out = node.cmd(f"{tool} -batch - <<'EOF' 2>&1; echo __rc=$?\n{body}\nEOF")
        text, _, rc = out.strip().rpartition("__rc=")
        if rc.strip() != "0":
            raise TopologyError("link", f"{node.name}: " + _batch_failure(tool, mine, text))


def _batch_failure(tool: str, lines: list[str], stderr: str) -> str:
    """The command ``-batch`` stopped at (it names the line: "Command failed -:N")."""
    line = None
    for word in stderr.replace(":", " ").split():
        if word.isdigit():
            line = int(word)
    cmd = lines[line - 1] if line and 0 < line <= len(lines) else "?"
    return f"`{tool} {cmd}` failed: {stderr.strip()[-300:]}"


def set_port_layouts(ports: list[tuple[Any, str, list[str]]]) -> None:
    """Give running ports a new qdisc layout: each (node, device, its tc commands from an
    empty root), applied with one ``tc -batch`` per namespace, the wire size table put back
    on each new root (lab/net/wire.py). What the traffic-class kinds use to turn a fabric's
    single FIFOs into classes (``controllers.classes``) and back (``tc_commands``).

    The old root goes first, so its counters go with it: call it before a measurement
    window opens, never inside one."""
    lines = [(node, f"qdisc del dev {dev} root") for node, dev, _ in ports]
    lines += [(node, c.removeprefix("tc ")) for node, _, cmds in ports for c in cmds]
    _run_batches("tc", lines)
    by_ns: dict[int | None, list[Qdisc]] = {}
    for node, dev, _ in ports:
        by_ns.setdefault(node.pid if node.inNamespace else None, []).append(Qdisc(dev))
    for pid, qdiscs in by_ns.items():
        count_wire_bytes(pid, qdiscs)
