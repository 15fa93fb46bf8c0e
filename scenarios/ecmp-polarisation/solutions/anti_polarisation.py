"""Solution: a seed per tier. The tier is the switch name without its number.

Why the tiers agree under one seed: a flow reaching aggregation bucket i at the edge did so
because ``h(flow) % 2 == i``; the aggregation switch computes the very same ``h(flow) % 2``
and so always takes its i-th core uplink. Mixing the tier into the seed makes the second
hash a different function, unrelated to the first. Switches of one tier still share their
seed, so a flow's path does not depend on which edge switch of the pod it met.

This is ``hash5-tier`` in ``controllers/policies/``; real switches do the same with a
per-device hash seed or a different hash function per tier.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from controllers.policies import FlowKey, HashPolicy
from controllers.policies.base import pack_5tuple, pick, seeded_crc

EXERCISE = "anti-polarisation"     # `fabriclab grade` finds the exercise by this line


class AntiPolarisation(HashPolicy):
    name = "anti-polarisation"
    granularity = "flow"

    def choose(self, flow: FlowKey, switch: str, ports: Sequence[int]) -> int:
        tier = switch.rstrip("0123456789")
        seed = self.seed ^ zlib.crc32(tier.encode())
        return pick(ports, seeded_crc(pack_5tuple(flow), seed))
