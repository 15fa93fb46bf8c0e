"""``hash-l3``: per host pair hashing over IP addresses only (the polarisation baseline)."""

from __future__ import annotations

from collections.abc import Sequence

from controllers.policies.base import FlowKey, HashPolicy, pack_l3, pick, seeded_crc


class HashL3(HashPolicy):
    """Seeded CRC over src/dst IP only: low entropy on purpose.

    Every flow between one pair of hosts takes the same uplink, however many flows there
    are, which is what fabrics hashing on L3 headers only (or on tunnelled traffic whose
    outer header hides the ports) show. Because the decision does not depend on the flow,
    it is installed proactively per pair (granularity ``pair``).
    """

    name = "hash-l3"
    granularity = "pair"

    def choose(self, flow: FlowKey, switch: str, ports: Sequence[int]) -> int:
        return pick(ports, seeded_crc(pack_l3(flow), self.seed))
