"""``flowlet``: re-hash a flow after it has been idle, within what OpenFlow allows."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import ClassVar

from controllers.policies.base import FlowKey, HashPolicy, pack_5tuple, pick, seeded_crc


class Flowlet(HashPolicy):
    """A 5-tuple hash salted with the flow's flowlet number: a new flowlet may move.

    Flowlet switching (CONGA, Let-It-Flow) re-balances a long flow at its pauses: a gap
    longer than the path-delay difference means the next burst cannot overtake the last,
    so it may take another path without reordering. Real switches measure that gap per
    packet, in tens to hundreds of microseconds.

    Why the gap here is a whole second: OpenFlow and OVS cannot time packets. The only
    datapath-side idle detector is a flow entry's ``idle_timeout``, in whole seconds. So the
    controller installs each decision with ``idle_timeout = 1``; when a flow pauses for a
    second its entry expires, its next packet comes back to the controller, and that starts
    a new flowlet with a fresh hash. Elephants that never pause never move (that is the
    honest result on this datapath); on/off traffic (a collective's steps with compute gaps
    of over a second, streams that stall) does.

    Several packets of one burst can reach the controller before the entry is installed;
    a decision less than ``idle_timeout`` after the previous one for the same (switch, flow)
    keeps the flowlet number, so one burst is never split.
    """

    name = "flowlet"
    granularity = "flow"
    idle_timeout: ClassVar[int | None] = 1

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self._flowlet: dict[tuple[str, FlowKey], tuple[int, float]] = {}

    def flowlet_of(self, flow: FlowKey, switch: str, now: float | None = None) -> int:
        """The flowlet number of ``flow`` at ``switch`` for a packet seen at ``now``."""
        now = time.monotonic() if now is None else now
        number, last = self._flowlet.get((switch, flow), (-1, float("-inf")))
        if now - last >= float(self.idle_timeout or 1):
            number += 1
        self._flowlet[(switch, flow)] = (number, now)
        return number

    def choose(self, flow: FlowKey, switch: str, ports: Sequence[int]) -> int:
        number = self.flowlet_of(flow, switch)
        return pick(ports, seeded_crc(pack_5tuple(flow) + number.to_bytes(4, "big"),
                                      self.seed))
