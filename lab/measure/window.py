"""One measurement window: the fabric's counters read when traffic starts and when it has
drained, on the sampler's clock.

Every number of a phase is a difference between these two reads: a port's bytes, drops
and queue series, a flow's bytes on each switch (its path), the measured seconds rates are
divided by. Reading them in one place, in one order, keeps ``links`` and ``flows`` of
every kind comparable: the close waits for queues to drain and per-flow counters to stop
moving, so the last packets of a flow are counted on both sides.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from lab.measure import live, telemetry
from lab.measure.result import link_entries
from lab.measure.telemetry import SpareWork

FlowCounters = dict[str, dict[int, tuple[int, int]]]


class Window:
    """Counters of ``ports`` and of ``bridges``' per-flow entries between open and close.

    Times (``t_start``, ``t_end``) are seconds on ``sampler``'s clock, as its series are.
    """

    def __init__(self, sampler: telemetry.Sampler, ports: list[telemetry.Port],
                 bridges: list[str], name: str = "traffic") -> None:
        self.sampler = sampler
        self.ports = ports
        self.bridges = bridges
        #: The phase the window measures, as a live view names it.
        self.name = name
        self.t_start = self.t_end = 0.0

    def open(self) -> None:
        """Read every counter before the traffic starts."""
        self.before = telemetry.snapshot(self.ports)
        self.flows0 = telemetry.flow_counters(self.bridges)
        self.t_start = time.monotonic() - self.sampler.t0
        live.set_phase(self.name)

    def close(self) -> None:
        """Read them again once the queues are empty and the flow counters still."""
        live.set_phase(self.name, "draining")
        self.after = telemetry.drained_snapshot(self.ports)
        self.t_end = time.monotonic() - self.sampler.t0
        self.flows1 = telemetry.settled_flow_counters(self.bridges)
        live.set_phase(self.name, "done")

    @property
    def measured_s(self) -> float:
        """The seconds between the two reads: what counters' rates are divided by."""
        return max(self.t_end - self.t_start, 1e-3)

    def flow_deltas(self) -> FlowCounters:
        """{bridge: {cookie: (packets, bytes)}} over the window."""
        return {br: {c: (v[0] - self.flows0[br].get(c, (0, 0))[0],
                         v[1] - self.flows0[br].get(c, (0, 0))[1])
                     for c, v in self.flows1[br].items()} for br in self.bridges}

    def links(self) -> list[dict[str, Any]]:
        """result.json's ``links`` of the window (series from the sampler, times from open)."""
        return link_entries(self.ports, self.before, self.after, self.sampler, self.measured_s,
                            self.t_start)

    def judge(self, t_from: float, t_to: float,
              spare: Sequence[SpareWork] = ()) -> dict[str, Any]:
        """The fidelity numbers of the traffic between two sample times inside the window
        (``spare``: work burnt on purpose at idle priority, counted as idle)."""
        return self.sampler.judge(self.t_start, t_from, t_to, spare)
