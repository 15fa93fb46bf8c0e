"""What each switch's tables should hold, as plain data, before any OpenFlow is involved.

Pipeline (the numbers live here and only here):

- table 0 (``TABLE_WATCH``): per-flow counter entries the lab asks for (``PRIO_WATCH``),
  each ``goto_table:1``, above a ``PRIO_DEFAULT`` ``goto_table:1``. Counting in a table of
  its own means a counter can never change where a packet goes.
- table 1 (``TABLE_FORWARD``): IPv4 forwarding on the destination address. One candidate:
  output. Several: by the policy's granularity, a select group (``switch``), a per source
  entry (``pair``, ``PRIO_PAIR`` above a ``PRIO_DST`` fallback) or, for TCP and UDP, a
  send-to-controller (``PRIO_DST_L4``) that packet-ins turn into exact ``PRIO_FLOW`` entries
  (``flow``); a ``flow`` policy's other IPv4 traffic (ICMP: reachability checks) takes a
  select group at ``PRIO_DST``, so it never waits for the controller. Above all of them, exact
  ``PRIO_PIN`` entries the lab asks for: a placement computed from the whole job (a
  collision-free ring), which no per-flow hash can know.

There is no table-miss entry in table 1: traffic nobody routed (ARP, IPv6, unknown
addresses) is dropped, never flooded, so every packet counted is one the lab expected.
Keeping this pure lets the unit tests check the tables for every granularity without
a switch, and lets both runtimes share it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controllers.policies import FlowKey, HashPolicy

TABLE_WATCH = 0
TABLE_FORWARD = 1

PRIO_DEFAULT = 0          # table 0: everything continues to forwarding
PRIO_GATEWAY = 5          # table 1: frames for a gateway's MAC (off-fabric destinations)
PRIO_DST = 10             # table 1: per destination host
PRIO_DST_L4 = 15          # table 1: per destination host and L4 protocol (``flow`` policies)
PRIO_PAIR = 20            # table 1: per (source, destination) host pair
PRIO_FLOW = 30            # table 1: per 5-tuple, installed on packet-in
PRIO_PIN = 40             # table 1: per 5-tuple, placed by the lab (``pin`` request)
PRIO_WATCH = 100          # table 0: per 5-tuple counter

FLOW_IDLE_TIMEOUT = 30    # s: reactive entries expire with their flow

ETH_TYPE_IPV4 = 0x0800
PROTO_TCP, PROTO_UDP = 6, 17
_L4_FIELDS = {PROTO_TCP: ("tcp_src", "tcp_dst"), PROTO_UDP: ("udp_src", "udp_dst")}

#: OXM field name -> value, as both runtimes' ``OFPMatch(**fields)`` take them.
MatchFields = tuple[tuple[str, int | str], ...]


@dataclass(frozen=True)
class Action:
    """The single action of an entry: ``output`` a port, send to a ``group``, send to the
    ``controller``, or ``goto`` a table."""

    kind: str
    arg: int = 0


@dataclass(frozen=True)
class FlowEntry:
    table: int
    priority: int
    match: MatchFields
    action: Action
    cookie: int = 0
    idle_timeout: int = 0

    def match_dict(self) -> dict[str, int | str]:
        return dict(self.match)


@dataclass(frozen=True)
class SelectGroup:
    """One select group: a weight-1 bucket per port, each watching its own port."""

    group_id: int
    ports: tuple[int, ...]


@dataclass(frozen=True)
class SwitchPlan:
    groups: tuple[SelectGroup, ...]
    flows: tuple[FlowEntry, ...]


@dataclass(frozen=True)
class Pin:
    """A flow the lab placed: on ``switch`` this 5-tuple leaves by ``port``."""

    switch: str
    key: FlowKey
    port: int


@dataclass(frozen=True)
class Watch:
    """A per-flow counter the lab asked for: this 5-tuple, counted under this cookie."""

    cookie: int
    key: FlowKey


def flow_match(key: FlowKey) -> MatchFields:
    """Exact match on a 5-tuple; ports only for TCP/UDP (others have none to match)."""
    fields: list[tuple[str, int | str]] = [("eth_type", ETH_TYPE_IPV4), ("ip_proto", key.proto),
                                           ("ipv4_src", key.src), ("ipv4_dst", key.dst)]
    l4 = _L4_FIELDS.get(key.proto)
    if l4 is not None:
        fields += [(l4[0], key.sport), (l4[1], key.dport)]
    return tuple(fields)


def reactive_entry(key: FlowKey, port: int, idle_timeout: int | None = None) -> FlowEntry:
    """The exact entry a packet-in under a ``flow`` policy installs.

    ``idle_timeout`` is the policy's (a flowlet policy re-decides after a pause); by default
    the entry lives as long as its flow.
    """
    return FlowEntry(TABLE_FORWARD, PRIO_FLOW, flow_match(key), Action("output", port),
                     idle_timeout=FLOW_IDLE_TIMEOUT if idle_timeout is None else idle_timeout)


def watch_entry(watch: Watch) -> FlowEntry:
    return FlowEntry(TABLE_WATCH, PRIO_WATCH, flow_match(watch.key),
                     Action("goto", TABLE_FORWARD), cookie=watch.cookie)


def pin_entry(pin: Pin) -> FlowEntry:
    return FlowEntry(TABLE_FORWARD, PRIO_PIN, flow_match(pin.key), Action("output", pin.port))


def _dst(ip: str) -> MatchFields:
    return (("eth_type", ETH_TYPE_IPV4), ("ipv4_dst", ip))


def _via(mac: str) -> MatchFields:
    return (("eth_type", ETH_TYPE_IPV4), ("eth_dst", mac))


def reactive_pair_entry(src: str, dst: str, gateway_mac: str, port: int) -> FlowEntry:
    """A ``pair`` policy's entry for an off-fabric destination, installed on packet-in.

    Proactive pair entries need the destination address in advance; addresses behind a
    gateway are only known when their first packet arrives.
    """
    return FlowEntry(TABLE_FORWARD, PRIO_PAIR,
                     (("eth_type", ETH_TYPE_IPV4), ("eth_dst", gateway_mac),
                      ("ipv4_src", src), ("ipv4_dst", dst)),
                     Action("output", port), idle_timeout=FLOW_IDLE_TIMEOUT)


def _gateway_entry(host: Mapping[str, Any], ports: tuple[int, ...],
                   group_of: Mapping[tuple[int, ...], int], policy: HashPolicy) -> FlowEntry:
    """Frames addressed to a gateway's MAC, by the policy's granularity."""
    match = _via(host["mac"])
    if len(ports) == 1:
        return FlowEntry(TABLE_FORWARD, PRIO_GATEWAY, match, Action("output", ports[0]))
    if policy.granularity == "switch":
        return FlowEntry(TABLE_FORWARD, PRIO_GATEWAY, match, Action("group", group_of[ports]))
    # pair and flow: decided per destination or per 5-tuple when the first packet arrives
    return FlowEntry(TABLE_FORWARD, PRIO_GATEWAY, match, Action("controller"))


def switch_plan(switch: str, routes: Mapping[str, Sequence[int]],
                hosts: Sequence[Mapping[str, Any]], policy: HashPolicy) -> SwitchPlan:
    """Groups and forwarding entries of ``switch`` (watch entries are added separately).

    ``routes`` is this switch's {host name: sorted candidate ports}; ``hosts`` are
    {name, ip} mappings. Deterministic: the same inputs give the same entries in the same
    order and the same group ids, so two runs (and two runtimes) program identically.
    """
    flows = [FlowEntry(TABLE_WATCH, PRIO_DEFAULT, (), Action("goto", TABLE_FORWARD))]
    multi = sorted({tuple(p) for p in routes.values() if len(p) > 1})
    group_of = {ports: gid for gid, ports in enumerate(multi, start=1)}
    groups: list[SelectGroup] = []
    if policy.granularity in ("switch", "flow"):
        groups = [SelectGroup(gid, ports) for ports, gid in group_of.items()]
    by_name = sorted(hosts, key=lambda h: h["name"])
    for host in by_name:
        ports = tuple(routes.get(host["name"], ()))
        if not ports:
            continue                                  # unreachable: dropped, by design
        ip = host["ip"]
        if len(ports) == 1:
            flows.append(FlowEntry(TABLE_FORWARD, PRIO_DST, _dst(ip), Action("output", ports[0])))
        elif policy.granularity == "switch":
            flows.append(FlowEntry(TABLE_FORWARD, PRIO_DST, _dst(ip),
                                   Action("group", group_of[ports])))
        elif policy.granularity == "pair":
            for src in by_name:
                if src["name"] == host["name"]:
                    continue
                port = policy.choose(FlowKey(src["ip"], ip, 0, 0, 0), switch, ports)
                flows.append(FlowEntry(TABLE_FORWARD, PRIO_PAIR,
                                       (("eth_type", ETH_TYPE_IPV4), ("ipv4_src", src["ip"]),
                                        ("ipv4_dst", ip)), Action("output", port)))
            flows.append(FlowEntry(TABLE_FORWARD, PRIO_DST, _dst(ip), Action("output", ports[0])))
        elif policy.granularity == "flow":
            # Only TCP and UDP carry the 5-tuple a per-flow policy decides on; a packet-in per
            # ping per hop made reachability of a k=8 fat-tree (16,256 pairs) a controller storm.
            for proto in (PROTO_TCP, PROTO_UDP):
                flows.append(FlowEntry(TABLE_FORWARD, PRIO_DST_L4,
                                       (*_dst(ip), ("ip_proto", proto)), Action("controller")))
            flows.append(FlowEntry(TABLE_FORWARD, PRIO_DST, _dst(ip),
                                   Action("group", group_of[ports])))
        else:
            raise ValueError(f"policy {policy.name!r}: unknown granularity "
                             f"{policy.granularity!r}")
        if host.get("gateway"):
            flows.append(_gateway_entry(host, ports, group_of, policy))
    return SwitchPlan(tuple(groups), tuple(flows))


# -- the lab's watch requests --------------------------------------------------------------

class RequestError(ValueError):
    """A control request the controller refuses; the message says which field and why."""


def _req_int(obj: Mapping[str, Any], key: str, where: str, lo: int, hi: int) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise RequestError(f"{where}.{key}: expected an integer in {lo}..{hi}, got {value!r}")
    return value


def _req_ip(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    try:
        return str(ipaddress.IPv4Address(value))  # type: ignore[arg-type]
    except (ipaddress.AddressValueError, ValueError, TypeError):
        raise RequestError(f"{where}.{key}: expected a dotted IPv4 address, got {value!r}") \
            from None


def _req_key(obj: Mapping[str, Any], where: str) -> FlowKey:
    proto = _req_int(obj, "proto", where, 0, 255)
    sport = _req_int(obj, "sport", where, 0, 65535) if "sport" in obj else 0
    dport = _req_int(obj, "dport", where, 0, 65535) if "dport" in obj else 0
    if proto not in _L4_FIELDS:
        sport = dport = 0                # not matched for protocols without ports
    return FlowKey(_req_ip(obj, "src", where), _req_ip(obj, "dst", where), proto, sport, dport)


def parse_watch(obj: Any, where: str = "flows[0]") -> Watch:
    """One element of a ``watch`` request's ``flows``."""
    if not isinstance(obj, Mapping):
        raise RequestError(f"{where}: expected an object")
    # Cookie 0 is what every forwarding entry carries: a counter under it would be lost.
    cookie = _req_int(obj, "cookie", where, 1, 2**64 - 1)
    return Watch(cookie, _req_key(obj, where))


def parse_pin(obj: Any, ports_of: Mapping[str, set[int]], where: str = "flows[0]") -> Pin:
    """One element of a ``pin`` request: a 5-tuple, a switch and one of its ports."""
    if not isinstance(obj, Mapping):
        raise RequestError(f"{where}: expected an object")
    switch = obj.get("switch")
    if switch not in ports_of:
        raise RequestError(f"{where}.switch: unknown switch {switch!r}")
    port = _req_int(obj, "port", where, 1, 0xFFFFFF00)
    if port not in ports_of[switch]:
        raise RequestError(f"{where}.port: {switch} has no port {port} "
                           f"(ports: {sorted(ports_of[switch])})")
    return Pin(switch, _req_key(obj, where), port)


# -- changing a programmed switch: reroutes and reconciliation ------------------------------

@dataclass(frozen=True)
class PlanChanges:
    """What turns a switch's tables from one state into another, in a safe order.

    Make before break: new groups first, then new or changed entries (an OpenFlow ADD of an
    entry with the same table, priority and match replaces it in one step), then the entries
    nobody wants any more, then the groups nothing points to. A packet therefore always meets
    either the old or the new forwarding, never a gap.
    """

    groups_add: tuple[SelectGroup, ...] = ()
    flows_add: tuple[FlowEntry, ...] = ()
    flows_delete: tuple[FlowEntry, ...] = ()
    groups_delete: tuple[SelectGroup, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.groups_add or self.flows_add or self.flows_delete or self.groups_delete)

    def counts(self) -> dict[str, int]:
        return {"groups_added": len(self.groups_add), "entries_added": len(self.flows_add),
                "entries_deleted": len(self.flows_delete),
                "groups_deleted": len(self.groups_delete)}


def entry_key(entry: FlowEntry) -> tuple[int, int, frozenset[tuple[str, int | str]]]:
    """What identifies an entry in a switch: table, priority and match (order-free)."""
    return entry.table, entry.priority, frozenset(entry.match)


def renumber_groups(installed: Sequence[SelectGroup], wanted: SwitchPlan) -> SwitchPlan:
    """``wanted`` with group ids that never give an installed id a new meaning.

    A port set already installed keeps its id; a new one gets an id above every installed
    one. So rerouting (or a new controller reconciling a switch its predecessor rerouted)
    adds groups and moves entries to them, and never changes what an id in use selects.
    """
    have = {g.ports: g.group_id for g in installed}
    next_id = max((g.group_id for g in installed), default=0) + 1
    remap: dict[int, int] = {}
    groups = []
    for g in wanted.groups:
        gid = have.get(g.ports)
        if gid is None:
            gid, next_id = next_id, next_id + 1
        remap[g.group_id] = gid
        groups.append(SelectGroup(gid, g.ports))
    flows = tuple(FlowEntry(e.table, e.priority, e.match, Action("group", remap[e.action.arg]),
                            e.cookie, e.idle_timeout) if e.action.kind == "group" else e
                  for e in wanted.flows)
    return SwitchPlan(tuple(groups), flows)


def plan_changes(installed: SwitchPlan, wanted: SwitchPlan) -> PlanChanges:
    """The changes from what a switch holds to what it should hold (see ``PlanChanges``)."""
    have = {entry_key(e): e for e in installed.flows}
    want = {entry_key(e): e for e in wanted.flows}
    have_groups = {g.group_id: g for g in installed.groups}
    want_ids = {g.group_id for g in wanted.groups}
    return PlanChanges(
        groups_add=tuple(g for g in wanted.groups if have_groups.get(g.group_id) != g),
        flows_add=tuple(e for k, e in want.items() if not _same(have.get(k), e)),
        flows_delete=tuple(e for k, e in have.items() if k not in want),
        groups_delete=tuple(g for g in installed.groups if g.group_id not in want_ids))


def _same(a: FlowEntry | None, b: FlowEntry) -> bool:
    """Equal as a switch sees it: the match's field order is not part of an entry."""
    return a is not None and entry_key(a) == entry_key(b) and \
        (a.action, a.cookie, a.idle_timeout) == (b.action, b.cookie, b.idle_timeout)


def topology_without(topo: Mapping[str, Any], down: set[int]) -> dict[str, Any]:
    """The topology with the switch links numbered in ``down`` taken out."""
    return {**topo, "links": [lk for i, lk in enumerate(topo["links"]) if i not in down]}


def watch_of(entry: FlowEntry) -> Watch | None:
    """A per-flow counter entry found in a switch, as the lab's watch it stands for."""
    if entry.table != TABLE_WATCH or entry.priority != PRIO_WATCH or not entry.cookie:
        return None
    key = key_of_match(entry.match)
    return None if key is None else Watch(entry.cookie, key)


def key_of_match(match: MatchFields) -> FlowKey | None:
    """The 5-tuple an exact ``flow_match`` stands for (None for any other match)."""
    m = dict(match)
    try:
        proto = int(m["ip_proto"])
        l4 = _L4_FIELDS.get(proto)
        sport = int(m[l4[0]]) if l4 else 0
        dport = int(m[l4[1]]) if l4 else 0
        key = FlowKey(str(m["ipv4_src"]), str(m["ipv4_dst"]), proto, sport, dport)
    except (KeyError, TypeError, ValueError):
        return None
    return key if set(flow_match(key)) == set(match) else None
