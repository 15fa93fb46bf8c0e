"""``hash5-tier``: 5-tuple hashing with a seed per tier, so consecutive tiers do not polarise."""

from __future__ import annotations

from collections.abc import Sequence

from controllers.policies.base import FlowKey, HashPolicy, fmix32, pack_5tuple, pick, seeded_crc

#: What separates a switch's tier from its index in a name ("agg0_1", "tor-3"): stripped
#: together with the digits so every switch of a tier gets the same tier string.
_INDEX_CHARS = "0123456789_-."


def tier_of(switch: str) -> str:
    """The switch's tier: its name without the trailing index (``edge12`` -> ``edge``).

    The name, not the topology, because ``choose`` sees only the name, and the lab names
    switches role-then-index (``leaf1``, ``spine2``, ``edge3``, ``agg4``, ``core1``).
    """
    return switch.rstrip(_INDEX_CHARS)


class Hash5Tier(HashPolicy):
    """Seeded CRC over the 5-tuple, with the seed mixed with the switch's tier.

    Why: with one fabric-wide seed and the same hash on every tier (``hash5``), a flow's hash
    is the same number at the edge and at the aggregation switch. The flows an edge sends to
    its first uplink (``h % 2 == 0``) arrive at one aggregation switch all with
    ``h % 2 == 0`` and are sent, all of them, to that switch's first core uplink: the second
    choice is fully determined by the first and half the core links carry nothing. This is
    *hash polarisation*, and real fabrics avoid it by giving each tier its own hash seed or
    function. Mixing the tier into the seed does the same here: consecutive tiers partition
    flows independently, while the switches of one tier still agree (a flow's decision
    does not depend on which leaf or which aggregation switch it happens to cross, so the
    controller's tables stay as predictable as ``hash5``'s).
    """

    name = "hash5-tier"
    granularity = "flow"
    decides_ahead = True

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        #: {switch name: that switch's tier seed}; switch names are few, flows are many.
        self._seeds: dict[str, int] = {}

    def tier_seed(self, switch: str) -> int:
        """The seed a switch hashes with: the policy's seed mixed with the switch's tier.

        ``seeded_crc`` already makes different seeds pick different partitions (it mixes
        after the CRC), so the tier only has to turn into a well-spread 32-bit number:
        the CRC of the tier name under the policy seed, finalised once more so that the
        result is not the same value the flow hash would start from.
        """
        seed = self._seeds.get(switch)
        if seed is None:
            seed = fmix32(seeded_crc(tier_of(switch).encode(), self.seed) ^ 0x7131E5ED)
            self._seeds[switch] = seed
        return seed

    def choose(self, flow: FlowKey, switch: str, ports: Sequence[int]) -> int:
        return pick(ports, seeded_crc(pack_5tuple(flow), self.tier_seed(switch)))
