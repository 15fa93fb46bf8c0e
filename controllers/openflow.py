"""Plan entries (``controllers.plan``) turned into OpenFlow 1.3 messages for one datapath.

Only the datapath's own ``ofproto``/``ofproto_parser`` are used, so this module works the
same under os-ken and Ryu without importing either.
"""

from __future__ import annotations

from typing import Any

from controllers.checksum import fix_checksums
from controllers.plan import Action, FlowEntry, SelectGroup


def _instructions(dp: Any, action: Action) -> list[Any]:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    if action.kind == "goto":
        return [parser.OFPInstructionGotoTable(action.arg)]
    if action.kind == "output":
        acts = [parser.OFPActionOutput(action.arg)]
    elif action.kind == "group":
        acts = [parser.OFPActionGroup(action.arg)]
    elif action.kind == "controller":
        # Whole packet in the packet-in (no switch buffer): the packet-out resends it.
        acts = [parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)]
    else:
        raise ValueError(f"unknown action {action.kind!r}")
    return [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, acts)]


def add_flow(dp: Any, entry: FlowEntry) -> Any:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPFlowMod(dp, cookie=entry.cookie, table_id=entry.table,
                             command=ofp.OFPFC_ADD, idle_timeout=entry.idle_timeout,
                             priority=entry.priority, buffer_id=ofp.OFP_NO_BUFFER,
                             match=parser.OFPMatch(**entry.match_dict()),
                             instructions=_instructions(dp, entry.action))


def delete_flow_strict(dp: Any, entry: FlowEntry) -> Any:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPFlowMod(dp, table_id=entry.table, command=ofp.OFPFC_DELETE_STRICT,
                             priority=entry.priority, out_port=ofp.OFPP_ANY,
                             out_group=ofp.OFPG_ANY,
                             match=parser.OFPMatch(**entry.match_dict()))


def add_group(dp: Any, group: SelectGroup) -> Any:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    buckets = [parser.OFPBucket(weight=1, watch_port=port, watch_group=ofp.OFPG_ANY,
                                actions=[parser.OFPActionOutput(port)])
               for port in group.ports]
    return parser.OFPGroupMod(dp, command=ofp.OFPGC_ADD, type_=ofp.OFPGT_SELECT,
                              group_id=group.group_id, buckets=buckets)


def delete_everything(dp: Any) -> list[Any]:
    """Every flow in every table, then every group: what a clean resync starts from."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return [parser.OFPFlowMod(dp, table_id=ofp.OFPTT_ALL, command=ofp.OFPFC_DELETE,
                              out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY,
                              match=parser.OFPMatch()),
            parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, group_id=ofp.OFPG_ALL)]


def port_stats_request(dp: Any) -> Any:
    """Counters of every port of the datapath (a load-aware policy's measurements)."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY)


def barrier(dp: Any) -> Any:
    return dp.ofproto_parser.OFPBarrierRequest(dp)


def packet_out(dp: Any, in_port: int, port: int, data: bytes) -> Any:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=in_port,
                               actions=[parser.OFPActionOutput(port)],
                               data=fix_checksums(data))
