"""``ovs-select``: let Open vSwitch hash, with an OpenFlow 1.3 select group per port set."""

from __future__ import annotations

from collections.abc import Sequence

from controllers.policies.base import FlowKey, HashPolicy, pack_5tuple, pack_l3, pick, seeded_crc

#: Protocols whose L4 ports OVS's default select hash includes (OVS's dp_hash
#: fields: TCP and SCTP only; UDP flows between one host pair all hash alike).
_L4_HASHED = frozenset({6, 132})
#: Stands in for OVS's own hash basis; any constant would do, it only has to differ from
#: the other policies' so the model does not accidentally agree with them.
_MODEL_SALT = 0x0F5E1EC7


class OvsSelect(HashPolicy):
    """The switch decides (granularity ``switch``): buckets of weight 1, one per port.

    ``choose`` is only an offline *model* of that decision (a seeded hash over the fields
    OVS's default selection method covers), for evaluating the policy without a fabric. The
    controller never uses it to install anything, and the real fabric's choices need not
    match it flow by flow: measure them from the counters instead.
    """

    name = "ovs-select"
    granularity = "switch"

    def choose(self, flow: FlowKey, switch: str, ports: Sequence[int]) -> int:
        data = pack_5tuple(flow) if flow.proto in _L4_HASHED else pack_l3(flow)
        return pick(ports, seeded_crc(data, self.seed ^ _MODEL_SALT))
