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


def add_group(dp: Any, group: SelectGroup, modify: bool = False) -> Any:
    """Add a select group (or, with ``modify``, give an existing id these buckets)."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    buckets = [parser.OFPBucket(weight=1, watch_port=port, watch_group=ofp.OFPG_ANY,
                                actions=[parser.OFPActionOutput(port)])
               for port in group.ports]
    return parser.OFPGroupMod(dp, command=ofp.OFPGC_MODIFY if modify else ofp.OFPGC_ADD,
                              type_=ofp.OFPGT_SELECT, group_id=group.group_id,
                              buckets=buckets)


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


def delete_group(dp: Any, group: SelectGroup) -> Any:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, type_=ofp.OFPGT_SELECT,
                              group_id=group.group_id)


def delete_by_out_port(dp: Any, table: int, match: dict[str, Any], port: int) -> Any:
    """Every entry of ``table`` at least as specific as ``match`` that outputs to ``port``:
    the per-flow decisions a reroute made wrong (they are taken again on the next packet)."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPFlowMod(dp, table_id=table, command=ofp.OFPFC_DELETE, out_port=port,
                             out_group=ofp.OFPG_ANY, match=parser.OFPMatch(**match))


def flow_stats_request(dp: Any) -> Any:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPFlowStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY)


def group_desc_request(dp: Any) -> Any:
    return dp.ofproto_parser.OFPGroupDescStatsRequest(dp, 0)


def port_desc_request(dp: Any) -> Any:
    return dp.ofproto_parser.OFPPortDescStatsRequest(dp, 0)


def more_parts(msg: Any) -> bool:
    """A multipart reply with more parts to come."""
    return bool(msg.flags & msg.datapath.ofproto.OFPMPF_REPLY_MORE)


def port_is_down(ofp: Any, desc: Any) -> bool:
    """A port that cannot carry packets: its link is down or it is administratively down."""
    return bool(desc.state & ofp.OFPPS_LINK_DOWN) or bool(desc.config & ofp.OFPPC_PORT_DOWN)


def entry_of_stats(ofp: Any, stat: Any) -> FlowEntry:
    """A flow-stats entry read back from a switch, in the plan's terms.

    An entry the plan could never have made (masked fields, several actions, other action
    types) gets the action ``other``, which no plan entry has: reconciliation deletes it.
    """
    match = tuple((k, v) for k, v in stat.match.items())
    insts = list(stat.instructions)
    action = Action("other")
    if len(insts) == 1 and not any(isinstance(v, tuple) for _, v in match):
        inst = insts[0]
        acts = list(getattr(inst, "actions", None) or [])
        if hasattr(inst, "table_id") and not hasattr(inst, "actions"):
            action = Action("goto", inst.table_id)
        elif len(acts) == 1 and hasattr(acts[0], "group_id"):
            action = Action("group", acts[0].group_id)
        elif len(acts) == 1 and getattr(acts[0], "port", None) == ofp.OFPP_CONTROLLER:
            action = Action("controller")
        elif len(acts) == 1 and hasattr(acts[0], "port"):
            action = Action("output", acts[0].port)
    return FlowEntry(stat.table_id, stat.priority, match, action, cookie=stat.cookie,
                     idle_timeout=stat.idle_timeout)


def group_of_desc(ofp: Any, desc: Any) -> SelectGroup:
    """A group read back from a switch; anything but single-output select buckets comes
    back with no ports, which no plan group has (so it is replaced or deleted)."""
    ports = []
    for bucket in desc.buckets:
        acts = list(bucket.actions)
        if desc.type != ofp.OFPGT_SELECT or len(acts) != 1 or not hasattr(acts[0], "port"):
            return SelectGroup(desc.group_id, ())
        ports.append(acts[0].port)
    return SelectGroup(desc.group_id, tuple(sorted(ports)))
