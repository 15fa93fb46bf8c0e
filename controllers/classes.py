"""Traffic classes on a lab port: a lossless priority for RoCE and a lossy one for the rest.

A DCB switch port keeps a queue per priority and schedules them by weight (ETS); PFC and
RoCE's ECN act on the lossless priority alone. On the lab's htb ports that is::

    1: htb (default 20) ── 1:1 (link) ─┬─ 1:10 lossless: weight x link, ceil link ── 10: bfifo
                                       └─ 1:20 lossy: (1 - weight) x link, ceil link ── 20: bfifo

with u32 filters sending the lossless DSCPs (RoCEv2 data and ACKs, and CNPs) to ``1:10``.
Each class may borrow the whole link when the other is idle (ceil = link), as ETS lets a
priority use what the others leave. The lossless leaf keeps the handle of every lab port's
queue (``QUEUE_HANDLE``), so the port's watched queue, backlog and marking are the lossless
class's; the lossy class has a leaf of its own.

Pure: the lab shapes ports with it and checks scenarios; the controller's PFC engine
(``controllers.pfc``) pauses and resumes the lossless class by these handles.
"""

from __future__ import annotations

from dataclasses import dataclass

from controllers.marking import QUEUE_HANDLE, htb_class_args

#: The lossless class and its leaf: the one PFC pauses and the RoCE traffic uses.
LOSSLESS_CLASS = "1:10"
LOSSLESS_LEAF = QUEUE_HANDLE
#: The lossy class (htb's default: whatever no filter claims) and its leaf.
LOSSY_CLASS = "1:20"
LOSSY_LEAF = "20:"
#: RoCEv2's data DSCP in common deployments (26, AF31) and its CNPs' (48, CS6: mlx5's
#: ``cnp_dscp`` default); both travel in the lossless priority.
ROCE_DSCP = 26
CNP_DSCP = 48
#: The 802.1p priority the lossless class stands for (RoCE's usual priority 3): what PFC's
#: counters are kept under.
LOSSLESS_PRIORITY = 3


@dataclass(frozen=True)
class TrafficClasses:
    """The classes of a port: the lossless class's share and its DSCPs, and both leaves'
    byte limits. ``weight`` is what the lossless class is guaranteed when both are busy."""

    weight: float = 0.5
    lossless_limit_bytes: int = 150_000
    lossy_limit_bytes: int = 150_000
    dscps: tuple[int, ...] = (ROCE_DSCP, CNP_DSCP)

    def __post_init__(self) -> None:
        if not 0 < self.weight < 1:
            raise ValueError(f"classes.weight: {self.weight!r} must be between 0 and 1 "
                             "(both classes need a share)")
        for name in ("lossless_limit_bytes", "lossy_limit_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"classes.{name}: must be a positive number of bytes")
        if not self.dscps or any(not 0 <= d <= 63 for d in self.dscps):
            raise ValueError(f"classes.dscps: {list(self.dscps)} are not DSCPs (0..63)")

    def tc_commands(self, dev: str, bw_mbps: float) -> list[str]:
        """The tc commands that give a port without a root qdisc these classes, in order."""
        w = self.weight
        cmds = [
            f"tc qdisc add dev {dev} root handle 1: htb default {LOSSY_CLASS.split(':')[1]}",
            f"tc class add dev {dev} parent 1: classid 1:1 {htb_class_args(bw_mbps)}",
            f"tc class add dev {dev} parent 1:1 classid {LOSSLESS_CLASS} "
            f"{htb_class_args(w * bw_mbps, bw_mbps)} prio 0",
            f"tc class add dev {dev} parent 1:1 classid {LOSSY_CLASS} "
            f"{htb_class_args((1 - w) * bw_mbps, bw_mbps)} prio 1",
            f"tc qdisc add dev {dev} parent {LOSSLESS_CLASS} handle {LOSSLESS_LEAF} "
            f"bfifo limit {self.lossless_limit_bytes}",
            f"tc qdisc add dev {dev} parent {LOSSY_CLASS} handle {LOSSY_LEAF} "
            f"bfifo limit {self.lossy_limit_bytes}",
        ]
        cmds += [f"tc filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip tos "
                 f"{d << 2:#x} 0xfc flowid {LOSSLESS_CLASS}" for d in self.dscps]
        return cmds
