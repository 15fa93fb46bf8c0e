"""Exercise: stop the aggregation tier from repeating the edge's choice (skeleton).

This is ``hash5``: a seeded hash of the 5-tuple, the same at every switch. Run it on the
fat-tree and count the aggregation->core links that carry anything:

    cd scenarios/ecmp-polarisation
    sudo fabriclab run ecmp-polarisation --policy exercises/anti_polarisation.py
    fabriclab policy-check --policy exercises/anti_polarisation.py

Change ``choose`` so that the second tier chooses independently of the first, while every
switch of one tier still decides alike (a flow must not depend on *which* edge switch it
met, only on the tier). Keep hashing the 5-tuple. A solution is in ../solutions/.
"""

from __future__ import annotations

from collections.abc import Sequence

from controllers.policies import FlowKey, HashPolicy
from controllers.policies.base import pack_5tuple, pick, seeded_crc

EXERCISE = "anti-polarisation"     # `fabriclab grade` finds the exercise by this line


class AntiPolarisation(HashPolicy):
    name = "anti-polarisation"
    granularity = "flow"

    def choose(self, flow: FlowKey, switch: str, ports: Sequence[int]) -> int:
        # TODO: the same hash at every tier is why the tiers agree.
        return pick(ports, seeded_crc(pack_5tuple(flow), self.seed))
