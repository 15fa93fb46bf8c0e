"""What a hash policy is: one decision, ``choose``, plus the granularity it is applied at.

The controller never asks a policy *how* to install itself; it asks *which* port one
flow (or one host pair) should take and installs that decision at the granularity the
policy declares. Keeping the decision a pure function of (flow, switch, ports, seed) is what
lets the lab evaluate a policy offline on millions of synthetic flows and then check, with
real packets and the switches' own counters, that the fabric did exactly what the function
said.
"""

from __future__ import annotations

import socket
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

#: The granularities a policy can declare; see ``HashPolicy``.
GRANULARITIES = ("switch", "pair", "flow")


@dataclass(frozen=True)
class FlowKey:
    """A flow's 5-tuple. Ports are 0 for protocols without them (ICMP and others).

    Frozen so it can key dicts and sets (decisions, counters) and cannot be altered after a
    decision was taken on it.
    """

    src: str
    dst: str
    proto: int
    sport: int
    dport: int

    def reversed(self) -> FlowKey:
        """The same conversation seen from the other end (ACKs, replies)."""
        return FlowKey(self.dst, self.src, self.proto, self.dport, self.sport)


class HashPolicy:
    """Base class of every ECMP policy. Subclass it in a new module of this package.

    ``granularity`` says where the decision is taken, because a real fabric can only hash at
    one of these places and each has a different cost and a different failure mode:

    - ``"switch"``: the switch decides by itself (an OpenFlow select group, hashed in the
      datapath at line rate, like an ASIC's ECMP). The controller cannot know the choice in
      advance; ``choose`` is then only an offline model of the switch's hash.
    - ``"pair"``: the controller decides once per (source IP, destination IP) pair and
      installs it proactively. No packet ever waits for the controller, but every flow of a
      pair shares one path: the polarisation that L3-only hashing causes in real fabrics.
    - ``"flow"``: the controller decides per 5-tuple, reactively, when a flow's first packet
      reaches it (packet-in). Finest spreading, at the price of a controller round trip per
      new flow and per switch: the behaviour of per-flow load balancers and of flowlet/
      software-defined schemes.
    """

    name: ClassVar[str] = ""
    granularity: ClassVar[str] = ""
    #: Seconds a ``flow`` decision's switch entry lives without packets; ``None``: the
    #: controller's default. A policy that re-decides after an idle gap (flowlets) sets it.
    idle_timeout: ClassVar[int | None] = None
    #: Seconds between port-load measurements the controller feeds to ``observe_ports``;
    #: 0: the policy does not use them (no statistics requests are sent).
    port_stats_interval: ClassVar[float] = 0.0
    #: ``choose`` depends on nothing but its arguments (no state, no clock): the controller
    #: may then decide the flows the lab announces (its watched 5-tuples) before their first
    #: packet, and only unannounced ones (iperf3's control connections) wait for a packet-in.
    #: The decision is the same either way; what changes is a burst of packet-ins when many
    #: flows start at once (a flow per host of a k=6 fat-tree: 108 connections at up to four
    #: multi-path hops in one second, which held two cores at 2 % idle).
    decides_ahead: ClassVar[bool] = False

    def __init__(self, seed: int = 0) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.seed = seed

    def choose(self, flow: FlowKey, switch: str, ports: Sequence[int]) -> int:
        """The one element of ``ports`` (sorted ascending) that ``flow`` leaves ``switch`` by."""
        raise NotImplementedError

    def observe_ports(self, switch: str, tx_bps: dict[int, float]) -> None:
        """Measured transmit rate of each port of ``switch`` (only if ``port_stats_interval``)."""

    def placed(self, flow: FlowKey, switch: str, port: int, rate_bps: float | None) -> None:
        """``flow`` was sent out of ``port``: a stateful policy updates its own estimate.

        ``rate_bps`` is known offline (synthetic flows have rates) and ``None`` on a live
        fabric, where a new flow's rate is not known at its first packet.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}(seed={self.seed})"


# -- hashing helpers shared by the policies ---------------------------------------------------

def _ip(addr: str) -> bytes:
    return socket.inet_aton(addr)


def pack_l3(flow: FlowKey) -> bytes:
    """The header bytes an L3-only hash sees: source and destination address."""
    return _ip(flow.src) + _ip(flow.dst)


def pack_5tuple(flow: FlowKey) -> bytes:
    """The header bytes a 5-tuple hash sees, in a fixed network-order layout."""
    return pack_l3(flow) + struct.pack("!BHH", flow.proto, flow.sport, flow.dport)


def fmix32(h: int) -> int:
    """MurmurHash3's 32-bit finaliser: a non-linear bijection that avalanches every bit."""
    h &= 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


def seeded_crc(data: bytes, seed: int) -> int:
    """CRC32 of ``data`` with ``seed`` as the initial value, then ``fmix32``.

    Why the finaliser: CRC is linear, so for inputs of one length a different initial value
    only XORs a constant into the result. ``crc % 2`` (or ``% 4``) would then merely relabel
    the ports: exactly the same flows would collide under every seed, and a multi-seed
    experiment would measure one hash function many times. Mixing after the CRC makes the
    seed pick a genuinely different partition of flows onto ports.
    """
    return fmix32(zlib.crc32(data, seed & 0xFFFFFFFF))


def pick(ports: Sequence[int], h: int) -> int:
    """``ports[h % len(ports)]``, refusing an empty candidate set (a routing bug upstream)."""
    if not ports:
        raise ValueError("no candidate ports to choose from")
    return ports[h % len(ports)]
