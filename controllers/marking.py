"""ECN marking as configured: a port's queue (rate, byte limit, the htb burst the lab gives
it), a marking (a step at K, or RED-like Kmin/Kmax/Pmax), and the thresholds DCTCP's
guidance gives. Pure: the controller's markers (``controllers.ecn``) apply it, the lab
checks scenarios and shapes links with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: Byte sizes (K, queue limit, htb burst) stay below 2^30: the BPF program multiplies
#: (vq - Kmin) by Pmax scaled to 2^32, and keeps burst + limit in 1/8e9-byte units, in 64 bits.
MAX_BYTES = 2**30


@dataclass(frozen=True)
class Marking:
    """Mark with p = 0 up to Kmin, rising linearly to Pmax at Kmax, 1 above Kmax.

    A DCTCP step at K (mark everything above K) is ``Marking.step(K)``: Kmin = Kmax = K,
    Pmax = 1. RED/DCQCN-style marking uses Kmin < Kmax and Pmax < 1.
    """

    kmin_bytes: int
    kmax_bytes: int
    pmax: float = 1.0

    def __post_init__(self) -> None:
        problem = _marking_problem(self.kmin_bytes, self.kmax_bytes, self.pmax)
        if problem:
            field, msg = problem
            raise ValueError(f"{field}: {msg}")

    @classmethod
    def step(cls, k_bytes: int) -> Marking:
        return cls(k_bytes, k_bytes, 1.0)

    @property
    def is_step(self) -> bool:
        return self.kmin_bytes == self.kmax_bytes and self.pmax == 1.0


#: DCTCP's rule for its step threshold (Alizadeh et al., "Data Center TCP", SIGCOMM 2010,
#: section 3.4; RFC 8257 discusses it): K > C x RTT / 7 keeps the queue from running dry
#: when every sender cuts its window at once, with C the bottleneck rate and RTT the flows'.
DCTCP_K_DIVISOR = 7
#: A K below one full-size frame marks every queued packet, and RED cannot express it (its
#: smallest threshold is one avpkt).
DCTCP_K_FLOOR_BYTES = 1500


def dctcp_k_bytes(rate_bps: float, rtt_s: float) -> tuple[int, dict[str, Any]]:
    """The step threshold DCTCP's guidance gives for a port of ``rate_bps`` carrying flows of
    round-trip time ``rtt_s``: the smallest whole number of bytes above C x RTT / 7, at least
    DCTCP_K_FLOOR_BYTES. Returns K and why (for the result)."""
    if isinstance(rate_bps, bool) or not isinstance(rate_bps, int | float) or \
            not 0 < rate_bps < math.inf:
        raise ValueError(f"rate_bps: must be a positive rate, not {rate_bps!r}")
    if isinstance(rtt_s, bool) or not isinstance(rtt_s, int | float) or not 0 < rtt_s < 60:
        raise ValueError(f"rtt_s: must be a round-trip time in (0, 60) s, not {rtt_s!r}")
    bound = rate_bps / 8 * rtt_s / DCTCP_K_DIVISOR
    k = max(DCTCP_K_FLOOR_BYTES, math.floor(bound) + 1)
    return k, {"rule": "K > C*RTT/7 (Alizadeh et al., SIGCOMM 2010; RFC 8257)",
               "rate_bps": rate_bps, "rtt_ms": round(rtt_s * 1000, 4),
               "bound_bytes": round(bound, 1), "floor_bytes": DCTCP_K_FLOOR_BYTES,
               "k_bytes": k}


#: The handle of every lab port's byte queue, htb class 1:1's leaf (a bfifo, or RED where
#: the port marks), as tc writes it. tc's handles are hexadecimal: "10:" is major 0x10.
QUEUE_HANDLE = "10:"


def tc_major(handle: str) -> int:
    """A tc handle ("10:") as the kernel's 32-bit handle (0x00100000), as netlink reports it."""
    return int(handle.rstrip(":"), 16) << 16


#: What a frame costs on an Ethernet wire beyond the bytes the kernel counts: preamble and
#: start-of-frame delimiter (8), inter-frame gap (12) and FCS (4). Every lab port charges it
#: per frame (``wire_size_table``), so a link's configured rate is a wire rate.
WIRE_OVERHEAD_BYTES = 24
#: The shortest frame on the wire: 64 bytes with its FCS, plus preamble and gap (tc's ``mpu``).
WIRE_MIN_FRAME_BYTES = 84
#: A full-size frame as the kernel counts it: a 1500-byte MTU and the 14-byte Ethernet header.
FRAME_BYTES = 1514
#: The same frame as the wire carries it.
WIRE_FRAME_BYTES = FRAME_BYTES + WIRE_OVERHEAD_BYTES
#: TCP's payload in a full-size frame: 1500 - 20 (IP) - 32 (TCP with timestamps, Linux's
#: default).
TCP_MSS_BYTES = 1448
#: The htb burst of every lab port: one wire frame. A token bucket of one frame is a wire:
#: each frame waits for its own time. htb lets a packet go while it has any tokens and
#: charges it in full, so a TSO packet of several frames leaves at once and the port then
#: owes its time (measured: no loss of rate at 4-frame TSO packets; 0.98 of TCP's ceiling
#: for large all-reduces, as with two frames).
HTB_BURST_BYTES = WIRE_FRAME_BYTES
#: The largest TSO/GSO packet a lab interface carries, in frames (``gso_max_segs``, set by
#: lab/net/links.py). A port's qdisc counts a TSO packet frame by frame (lab/net/wire.py)
#: but lets it go as one: after idle a port runs ahead of its wire by up to one TSO packet.
#: Per-frame shaping (tbf segmenting every TSO packet) would make it exact, but the
#: userspace datapath's cost is per packet: it took ovs-vswitchd from 20 % to 85 % of a core
#: and allreduce-sweep to 0 % idle. Measured on allreduce-sweep's small sizes (busbw against
#: TCP's ceiling on the wire): 4 frames (6 KB, 1 ms at 50 Mbit/s) stay below the ceiling at
#: every size (at most 0.993 over ten runs); 8 reached 1.02 and 16 reached 1.06.
#: ovs-vswitchd's share of a core was 85 / 54 / 35 % at 4 / 8 / 16 (20 % with TCP's own
#: sizes, 14 frames on average).
MAX_TSO_FRAMES = 4
#: What a port can send ahead of its wire after idle: its burst, and the rest of a TSO
#: packet that leaves as one.
AHEAD_BYTES = HTB_BURST_BYTES + (MAX_TSO_FRAMES - 1) * WIRE_FRAME_BYTES
#: htb's DRR quantum: explicit, or tc warns that rate/r2q is too big.
HTB_QUANTUM_BYTES = 100_000


def htb_class_args(rate_mbit: float, ceil_mbit: float | None = None) -> str:
    """An htb class's shaping as tc takes it: rate (and ceil) and the lab's burst. Every htb
    class the lab makes is written by this; the qdisc above it counts wire bytes
    (``wire_size_table``), so the class adds no overhead of its own."""
    ceil = rate_mbit if ceil_mbit is None else ceil_mbit
    return (f"htb rate {rate_mbit}mbit ceil {ceil}mbit burst {HTB_BURST_BYTES} "
            f"cburst {HTB_BURST_BYTES} quantum {HTB_QUANTUM_BYTES}")


#: TCP/IPv4 headers in front of each segment's payload, with the Ethernet header: 14 + 20 +
#: 32 (timestamps on, Linux's default).
TCP_FRAME_HEADER_BYTES = FRAME_BYTES - TCP_MSS_BYTES
#: The size table covers every packet up to this length: a TSO packet of up to 5 full
#: segments (the lab caps them at ``MAX_TSO_FRAMES``), and every single frame.
WIRE_TABLE_SLOTS = 8192


def wire_bytes(skb_len: int) -> int:
    """What a packet the kernel hands a port with ``skb_len`` bytes (Ethernet header
    included) costs on the wire: each frame's bytes plus ``WIRE_OVERHEAD_BYTES``, at least
    ``WIRE_MIN_FRAME_BYTES``. Longer than one full frame, it is a TCP TSO packet whose
    segments each repeat the headers (``TCP_FRAME_HEADER_BYTES``)."""
    if skb_len <= FRAME_BYTES:
        return max(skb_len + WIRE_OVERHEAD_BYTES, WIRE_MIN_FRAME_BYTES)
    payload = skb_len - TCP_FRAME_HEADER_BYTES
    frames = -(-payload // TCP_MSS_BYTES)
    return payload + frames * (TCP_FRAME_HEADER_BYTES + WIRE_OVERHEAD_BYTES)


def wire_size_table() -> list[int]:
    """The qdisc size table (tc's ``stab``, slot = packet length in bytes) that makes a
    port's qdisc count wire bytes: htb charges them against the rate, the byte queue
    against its limit. tc's own ``overhead`` would add once per packet, a TSO packet of n
    frames 24(n-1) bytes short; the table counts every frame."""
    return [wire_bytes(n) for n in range(WIRE_TABLE_SLOTS)]


def tcp_wire_ceiling_bps(rate_bps: float) -> float:
    """The most TCP payload a wire of ``rate_bps`` carries: full-size frames back to back,
    each ``TCP_MSS_BYTES`` of payload in ``WIRE_FRAME_BYTES`` on the wire (50 Mbit/s ->
    47.07 Mbit/s). The reverse direction's ACKs travel on the other direction's wire."""
    return rate_bps * TCP_MSS_BYTES / WIRE_FRAME_BYTES


@dataclass(frozen=True)
class PortQueue:
    """A port's configured shaping: htb rate and burst, and the bfifo limit.

    ``burst_bytes`` 0 means what a lab port sends ahead of its rate (``AHEAD_BYTES``). The
    tc-bpf marker needs it: that much of the traffic never waits in the bfifo.
    """

    intf: str
    rate_bps: int
    limit_bytes: int
    burst_bytes: int = 0

    def __post_init__(self) -> None:
        if not self.intf or len(self.intf) > 15 or "/" in self.intf or " " in self.intf:
            raise ValueError(f"intf: not an interface name: {self.intf!r}")
        for name, least in (("rate_bps", 1), ("limit_bytes", 1), ("burst_bytes", 0)):
            value = getattr(self, name)
            if not _is_int(value) or value < least:
                raise ValueError(f"{self.intf}.{name}: must be an integer >= {least}, "
                                 f"not {value!r}")
        for name in ("limit_bytes", "burst_bytes"):
            if getattr(self, name) > MAX_BYTES:
                raise ValueError(f"{self.intf}.{name}: at most {MAX_BYTES}")
        if self.htb_burst > MAX_BYTES:
            raise ValueError(f"{self.intf}.rate_bps: too fast ({self.rate_bps})")

    @property
    def htb_burst(self) -> int:
        return self.burst_bytes or AHEAD_BYTES


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _marking_problem(kmin: object, kmax: object, pmax: object) -> tuple[str, str] | None:
    """The first thing wrong with these values as (field, message), else None."""
    for name, value in (("kmin_bytes", kmin), ("kmax_bytes", kmax)):
        if not _is_int(value):
            return name, f"must be an integer number of bytes, not {value!r}"
        if value <= 0:
            return name, f"must be > 0, not {value}"
        if value > MAX_BYTES:
            return name, f"must be at most {MAX_BYTES}, not {value}"
    if kmin > kmax:  # type: ignore[operator]
        return "kmin_bytes", f"{kmin} is above kmax_bytes {kmax}"
    if isinstance(pmax, bool) or not isinstance(pmax, int | float):
        return "pmax", f"must be a number, not {pmax!r}"
    if not 0 < pmax <= 1:  # also rejects NaN
        return "pmax", f"must be in (0, 1], not {pmax}"
    return None


def parse_marking(obj: Any, where: str) -> Marking:
    """A Marking from config: ``{"k_bytes": K}`` (step) or ``{"kmin_bytes", "kmax_bytes",
    "pmax"}``. Errors are ValueErrors whose message starts with the field (``where.key``)."""
    prefix = f"{where}." if where else ""
    if not isinstance(obj, dict):
        raise ValueError(f"{where or 'marking'}: must be an object with k_bytes, or "
                         f"kmin_bytes/kmax_bytes/pmax, not {obj!r}")
    step_keys, red_keys = {"k_bytes"}, {"kmin_bytes", "kmax_bytes", "pmax"}
    for key in obj:
        if key not in step_keys | red_keys:
            raise ValueError(f"{prefix}{key}: unknown field (expected k_bytes, or "
                             f"kmin_bytes, kmax_bytes and pmax)")
    if "k_bytes" in obj:
        extra = sorted(red_keys & obj.keys())
        if extra:
            raise ValueError(f"{prefix}{extra[0]}: give either k_bytes or "
                             f"kmin_bytes/kmax_bytes/pmax, not both")
        k = obj["k_bytes"]
        problem = _marking_problem(k, k, 1.0)
        if problem:
            raise ValueError(f"{prefix}k_bytes: {problem[1]}")
        return Marking.step(k)
    for key in ("kmin_bytes", "kmax_bytes", "pmax"):
        if key not in obj:
            raise ValueError(f"{prefix}{key}: missing (or give k_bytes for a step)")
    problem = _marking_problem(obj["kmin_bytes"], obj["kmax_bytes"], obj["pmax"])
    if problem:
        raise ValueError(f"{prefix}{problem[0]}: {problem[1]}")
    return Marking(obj["kmin_bytes"], obj["kmax_bytes"], float(obj["pmax"]))
