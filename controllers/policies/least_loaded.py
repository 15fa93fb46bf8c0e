"""``least-loaded``: each new flow goes out of the port with the least measured load."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import ClassVar

from controllers.policies.base import FlowKey, HashPolicy, pack_5tuple, seeded_crc


class LeastLoaded(HashPolicy):
    """Placement by load at flow arrival, the way adaptive (CONGA/HULA-like) fabrics place.

    A hash is blind: it cannot see that two elephants already share an uplink. This policy
    reads each switch's per-port transmit rate (the controller polls port statistics every
    ``port_stats_interval`` seconds) and sends a new flow out of the least-loaded candidate.

    Measurements lag: flows that arrive together (a job's connections, a burst of streams)
    all see the same stale numbers, and would all pile onto the one port that looked idle
    (the herd effect of naive least-loaded). So the policy also counts what it placed since
    the last measurement, at the flow's rate when known (offline) or ``new_flow_bps``. Ties
    break on a seeded 5-tuple hash, so equal loads spread like ``hash5`` and runs repeat.

    Unlike a hash, the answer changes as loads change, so the decision is remembered per
    (switch, flow) for ``sticky_s``: the few packets of a flow that reach the controller
    before its entry is installed must all leave by one port, or the flow is split over two
    paths (the lab's path check catches exactly that).
    """

    name = "least-loaded"
    granularity = "flow"
    port_stats_interval: ClassVar[float] = 0.5
    #: Assumed rate of a flow placed since the last measurement (its own rate is unknown at
    #: its first packet); about one elephant of the lab's scenarios.
    new_flow_bps: ClassVar[float] = 20e6
    #: How long a decision is reused for the same flow at the same switch.
    sticky_s: ClassVar[float] = 5.0
    MAX_REMEMBERED: ClassVar[int] = 100_000

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self._measured: dict[str, dict[int, float]] = {}
        self._recent: dict[str, dict[int, float]] = {}
        self._decided: dict[tuple[str, FlowKey, tuple[int, ...]], tuple[int, float]] = {}
        self._fresh = False                     # the last choose() was a new decision

    def load(self, switch: str, port: int) -> float:
        """The policy's current estimate of ``port``'s transmit rate, bit/s."""
        return (self._measured.get(switch, {}).get(port, 0.0)
                + self._recent.get(switch, {}).get(port, 0.0))

    def choose(self, flow: FlowKey, switch: str, ports: Sequence[int]) -> int:
        if not ports:
            raise ValueError("no candidate ports to choose from")
        now = time.monotonic()
        key = (switch, flow, tuple(ports))
        earlier = self._decided.get(key)
        if earlier is not None and now - earlier[1] < self.sticky_s:
            self._fresh = False
            return earlier[0]
        h = seeded_crc(pack_5tuple(flow), self.seed)
        n = len(ports)
        # Rotate the candidates by the hash so that equal loads do not always pick ports[0].
        order = [ports[(h + i) % n] for i in range(n)]
        port = min(order, key=lambda p: self.load(switch, p))
        if len(self._decided) >= self.MAX_REMEMBERED:   # forget old decisions
            self._decided = {k: v for k, v in self._decided.items()
                             if now - v[1] < self.sticky_s}
            if len(self._decided) >= self.MAX_REMEMBERED // 2:
                self._decided.clear()       # an offline flood, not a live fabric: start over
        self._decided[key] = (port, now)
        self._fresh = True
        return port

    def placed(self, flow: FlowKey, switch: str, port: int, rate_bps: float | None) -> None:
        if not self._fresh:
            return                              # a repeat of a remembered decision
        self._fresh = False
        recent = self._recent.setdefault(switch, {})
        recent[port] = recent.get(port, 0.0) + (self.new_flow_bps if rate_bps is None
                                                else rate_bps)

    def observe_ports(self, switch: str, tx_bps: dict[int, float]) -> None:
        # A measurement includes the flows placed before it: forget them.
        self._measured[switch] = dict(tx_bps)
        self._recent.pop(switch, None)
