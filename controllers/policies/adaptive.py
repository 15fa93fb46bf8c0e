"""``adaptive``: a 5-tuple hash at arrival, then a flow moved off a port whose queue stays
above a threshold: switch adaptive routing at the speed a controller can have it."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import ClassVar

from controllers.policies.base import FlowKey, HashPolicy, pack_5tuple, pick, seeded_crc


class Adaptive(HashPolicy):
    """Where a hash put two elephants together, move one of them, as a switch's adaptive
    routing (Spectrum-X, Slingshot) does per packet or flowlet from its own queues.

    A switch reacts in microseconds. Here the lab samples every port's queue at its
    sampling rate (10 Hz) and hands each sample to the controller (``observe_queues``): a
    port whose queue was above ``threshold`` for ``hold_samples`` samples in a row is hot,
    and one of its flows moves to the candidate port with the shortest queue, if that one
    is below the threshold. So the reaction time is ``hold_samples`` sampling periods (0.2 s)
    plus one flow-table update. One flow moves per hot port per reaction; a moved flow stays
    for ``dwell_s``, and a port that took one is no target for ``settle_s`` (its queue does
    not show the newcomer yet): moving several at once, or the same one back and forth,
    would only swap which port is hot.

    A move reorders the moved flow's packets once (the new path may be shorter); TCP's
    reordering counters show it. A flow's counters then show two paths, which is the move.
    """

    name = "adaptive"
    granularity = "flow"
    #: The controller feeds this policy the ports' queues (``observe_queues``).
    observes_queues: ClassVar[bool] = True
    hold_samples: ClassVar[int] = 2
    dwell_s: ClassVar[float] = 2.0
    settle_s: ClassVar[float] = 0.5

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        #: (switch, flow) -> (port, candidate ports, monotonic time it was last moved)
        self.placed_on: dict[tuple[str, FlowKey], tuple[int, tuple[int, ...], float]] = {}
        self._hot: dict[tuple[str, int], int] = {}
        self._took: dict[tuple[str, int], float] = {}     # when a port last took a flow

    def choose(self, flow: FlowKey, switch: str, ports: Sequence[int]) -> int:
        earlier = self.placed_on.get((switch, flow))
        if earlier is not None and earlier[1] == tuple(ports):
            return earlier[0]           # packets before the entry is in, or a moved flow
        port = pick(ports, seeded_crc(pack_5tuple(flow), self.seed))
        self.placed_on[(switch, flow)] = (port, tuple(ports), float("-inf"))
        return port

    def observe_queues(self, switch: str, backlog: Mapping[int, int], threshold: int,
                       now: float | None = None) -> list[tuple[FlowKey, int, int]]:
        """One sample of ``switch``'s queues (bytes per port): the moves it calls for, as
        (flow, from port, to port). The controller installs them."""
        now = time.monotonic() if now is None else now
        moves = []
        for port, q in sorted(backlog.items()):
            key = (switch, port)
            self._hot[key] = self._hot.get(key, 0) + 1 if q > threshold else 0
            if self._hot[key] < self.hold_samples:
                continue
            move = self._one_off(switch, port, backlog, threshold, now)
            if move is not None:
                moves.append(move)
                self._hot[key] = 0
        return moves

    def _one_off(self, switch: str, port: int, backlog: Mapping[int, int], threshold: int,
                 now: float) -> tuple[FlowKey, int, int] | None:
        """The flow to move off ``port`` and where: of the flows there that have stayed
        ``dwell_s``, the first by seeded hash, to its candidate with the shortest queue."""
        here = sorted(((seeded_crc(pack_5tuple(f), self.seed), f, ports)
                       for (sw, f), (p, ports, t) in self.placed_on.items()
                       if sw == switch and p == port and now - t >= self.dwell_s
                       and len(ports) > 1), key=lambda x: x[0])
        for _, flow, ports in here:
            free = [p for p in ports if p != port and backlog.get(p, 0) < threshold
                    and now - self._took.get((switch, p), float("-inf")) >= self.settle_s]
            if free:
                to = min(free, key=lambda p: backlog.get(p, 0))
                self.placed_on[(switch, flow)] = (to, ports, now)
                self._took[(switch, to)] = now
                return flow, port, to
        return None
