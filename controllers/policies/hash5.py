"""``hash5``: per-flow 5-tuple hashing, decided by the controller on each flow's first packet."""

from __future__ import annotations

from collections.abc import Sequence

from controllers.policies.base import FlowKey, HashPolicy, pack_5tuple, pick, seeded_crc


class Hash5(HashPolicy):
    """Seeded CRC over src/dst/proto/sport/dport: what a well-configured ECMP ASIC does.

    Installed reactively (granularity ``flow``) so that each decision is known and logged,
    and can be checked against the counters afterwards. The switch name is deliberately not
    hashed: like one hash seed fabric-wide, consecutive tiers make correlated choices, which
    is part of what the lab studies.
    """

    name = "hash5"
    granularity = "flow"
    decides_ahead = True

    def choose(self, flow: FlowKey, switch: str, ports: Sequence[int]) -> int:
        return pick(ports, seeded_crc(pack_5tuple(flow), self.seed))
