"""The FabricLab controller app: static L3 ECMP for a topology the lab describes exactly.

Why it is built this way:

- The topology comes from the lab's config, never from discovery: no LLDP, no flooding,
  no learning, so nothing the controller does adds traffic or timing of its own to a
  measurement.
- Every (re)connection of a switch is a resync by reconciliation: the app reads back the
  switch's flows, groups and port states, then adds what is missing, replaces what differs
  and deletes what nobody asked for. A switch that kept stale state across a controller
  restart cannot forward by it, and one that kept the right state keeps its entries - and
  their counters, the lab's per-flow bytes - untouched. Counter entries and placements a
  predecessor installed for the lab are adopted, not dropped.
- Links fail: a port going down (OpenFlow port status) takes its link out of the routes,
  and every switch is moved, make-before-break, to the new shortest paths. Select-group
  buckets watch their port, so the switch next to a failure stops using it at once; the
  reroute fixes the switches further away, which cannot see it.
- A switch counts as programmed only after a barrier reply that follows its programming:
  OpenFlow gives no other guarantee that the switch has applied what it was sent. The lab
  starts traffic only when every switch is programmed.
- State shared by the app's event thread and the control server is guarded by one
  semaphore, because under os-ken's native hub they are real threads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from controllers import config, openflow, plan, policies, routing
from controllers.control import ControlServer
from controllers.plan import FlowEntry, Pin, SelectGroup, SwitchPlan, Watch
from controllers.policies import FlowKey
from controllers.requests import ControlRequests
from controllers.runtime import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    HUB_TYPE,
    MAIN_DISPATCHER,
    RUNTIME_NAME,
    RUNTIME_VERSION,
    BaseApp,
    hub,
    ipv4,
    ofp_event,
    ofproto_v1_3,
    packet,
    set_ev_cls,
    tcp,
    udp,
)

LOG = logging.getLogger("fabriclab.app")
HISTORY = 200                             # link events, reroutes and resyncs kept for status


@dataclass
class _Switch:
    """One connection of one configured switch (a reconnect is a new ``_Switch``)."""

    name: str
    dp: Any
    state: str = "connected"              # -> "programmed" | "error"
    since: float = field(default_factory=time.monotonic)
    errors: list[str] = field(default_factory=list)
    # What the switch said it holds, gathered from multipart replies before reconciling.
    waiting: set[str] = field(default_factory=lambda: {"flows", "groups", "ports"})
    seen_flows: list[FlowEntry] = field(default_factory=list)
    seen_groups: list[SelectGroup] = field(default_factory=list)
    seen_down: set[int] = field(default_factory=set)


@dataclass
class _Pending:
    """What to do when the barrier reply with this xid arrives (or the switch goes away)."""

    switch: _Switch
    errors_before: int
    done: Callable[[bool, str], None]     # (ok, why not)


def flow_key_of(data: bytes) -> FlowKey | None:
    """The 5-tuple of an Ethernet frame, or None if it is not IPv4 (those are not routed)."""
    pkt = packet.Packet(data)
    ip = pkt.get_protocol(ipv4.ipv4)
    if ip is None:
        return None
    sport = dport = 0
    if ip.offset == 0:                    # later fragments carry no L4 header
        l4 = pkt.get_protocol(tcp.tcp) or pkt.get_protocol(udp.udp)
        if l4 is not None and ip.proto in (plan.PROTO_TCP, plan.PROTO_UDP):
            sport, dport = l4.src_port, l4.dst_port
    return FlowKey(ip.src, ip.dst, ip.proto, sport, dport)


def frame_dst_mac(data: bytes) -> str:
    """Destination MAC of an Ethernet frame, as ``00:00:00:00:00:01``."""
    return ":".join(f"{b:02x}" for b in data[:6])


class FabricApp(ControlRequests, BaseApp):
    """Programs every configured switch and answers the lab on the control socket."""

    OFP_VERSIONS: ClassVar[list[int]] = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cfg = config.load_from_env()
        self.policy = policies.resolve(self.cfg.policy)(seed=self.cfg.seed)
        self.topo = self.cfg.topology()
        self.routes = routing.ecmp_routes(self.topo)
        # What each switch was last told to hold (groups and forwarding; counters and pins
        # aside): a reroute sends the difference to the plan for the new routes.
        self._installed: dict[str, SwitchPlan] = {}
        self.link_of_port = {}
        for i, lk in enumerate(self.cfg.links):
            self.link_of_port[(lk.a, lk.a_port)] = i
            self.link_of_port[(lk.b, lk.b_port)] = i
        self._ports_down: set[tuple[str, int]] = set()
        self._down_links: frozenset[int] = frozenset()
        self._link_events: list[dict[str, Any]] = []
        self._reroutes: list[dict[str, Any]] = []
        self._resyncs: list[dict[str, Any]] = []
        self.by_dpid = self.cfg.switch_by_dpid()
        self.host_by_ip = {h.ip: h for h in self.cfg.hosts}
        self.gateway_by_mac = {h.mac: h for h in self.cfg.hosts if h.gateway}
        self._lock = hub.Semaphore(1)
        self._switches: dict[str, _Switch] = {}
        self._pending: dict[tuple[Any, int], _Pending] = {}
        self._watched: dict[int, Watch] = {}
        self._pinned: dict[tuple[str, policies.FlowKey], Pin] = {}
        self.ports_of: dict[str, set[int]] = {s.name: set() for s in self.cfg.switches}
        for h in self.cfg.hosts:
            self.ports_of[h.switch].add(h.port)
        for lk in self.cfg.links:
            self.ports_of[lk.a].add(lk.a_port)
            self.ports_of[lk.b].add(lk.b_port)
        self.queues = {p.intf: p for p in self.cfg.ports}
        self._marker: Any = None            # controllers.ecn.Marker, made on first use
        self._markings: dict[str, Any] = {}
        self._pfcd: Any = None              # controllers.pfc.Pfcd while one runs
        self._pfc_lock = hub.Semaphore(1)   # one start or stop at a time
        self._decisions = 0
        # Last port counters per switch, for load-aware policies: {switch: (t, {port: bytes})}.
        self._port_bytes: dict[str, tuple[float, dict[int, int]]] = {}
        self._port_samples = 0              # measurements given to the policy (status)
        self._queue_samples = 0             # queue samples given to the policy (status)
        self._moves: list[dict[str, Any]] = []  # flows a queue-reading policy moved
        self.control = ControlServer(self.cfg.control_socket, self.handle_request, hub.spawn)
        LOG.info("fabric app on %s %s (%s hub): policy %s (%s) seed %d, %d switches, "
                 "%d hosts, %d switch links", RUNTIME_NAME, RUNTIME_VERSION, HUB_TYPE,
                 self.policy.name, self.policy.granularity, self.cfg.seed,
                 len(self.cfg.switches), len(self.cfg.hosts), len(self.cfg.links))

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> Any:
        thread = super().start()
        self.control.start()
        if self.policy.port_stats_interval > 0:
            hub.spawn(self._poll_ports)
        return thread

    def close(self) -> None:
        self.control.stop()
        self.stop_pfc()                     # never raises: the marker is closed too
        if self._marker is not None:
            self._marker.close()

    # -- helpers (call with self._lock held) -------------------------------------------------
    def _current(self, dp: Any) -> _Switch | None:
        for sw in self._switches.values():
            if sw.dp is dp:
                return sw
        return None

    def _send_barrier(self, sw: _Switch, done: Callable[[bool, str], None]) -> None:
        msg = openflow.barrier(sw.dp)
        sw.dp.set_xid(msg)                    # register before it can be answered
        self._pending[(sw.dp, msg.xid)] = _Pending(sw, len(sw.errors), done)
        sw.dp.send_msg(msg)

    # -- switch (re)connection: clean resync -------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _switch_features(self, ev: Any) -> None:
        dp = ev.msg.datapath
        name = self.by_dpid.get(ev.msg.datapath_id)
        if name is None:
            LOG.warning("switch with dpid %#x at %s is not in the config; not programming it",
                        ev.msg.datapath_id, dp.address)
            return
        with self._lock:
            old = self._switches.get(name)
            self._switches[name] = _Switch(name, dp)
            # Read back what the switch holds; _reconcile runs when all three replies are in.
            dp.send_msg(openflow.flow_stats_request(dp))
            dp.send_msg(openflow.group_desc_request(dp))
            dp.send_msg(openflow.port_desc_request(dp))
        LOG.info("%s (dpid %#x) %s: reading back its flows, groups and ports", name,
                 ev.msg.datapath_id, "reconnected" if old else "connected")

    def _reply_part(self, dp: Any, part: str, add: Callable[[_Switch], None],
                    more: bool) -> None:
        """One part of a read-back reply; the last one of all three reconciles the switch."""
        with self._lock:
            sw = self._current(dp)
            if sw is None or part not in sw.waiting:
                return
            add(sw)
            if more:
                return
            sw.waiting.discard(part)
            if not sw.waiting:
                self._reconcile(sw)

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _flow_stats(self, ev: Any) -> None:
        ofp = ev.msg.datapath.ofproto
        self._reply_part(ev.msg.datapath, "flows", lambda sw: sw.seen_flows.extend(
            openflow.entry_of_stats(ofp, st) for st in ev.msg.body), openflow.more_parts(ev.msg))

    @set_ev_cls(ofp_event.EventOFPGroupDescStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _group_desc(self, ev: Any) -> None:
        ofp = ev.msg.datapath.ofproto
        self._reply_part(ev.msg.datapath, "groups", lambda sw: sw.seen_groups.extend(
            openflow.group_of_desc(ofp, g) for g in ev.msg.body), openflow.more_parts(ev.msg))

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _port_desc(self, ev: Any) -> None:
        ofp = ev.msg.datapath.ofproto
        self._reply_part(ev.msg.datapath, "ports", lambda sw: sw.seen_down.update(
            p.port_no for p in ev.msg.body if openflow.port_is_down(ofp, p)),
            openflow.more_parts(ev.msg))

    def _reconcile(self, sw: _Switch) -> None:
        """Bring a (re)connected switch to its plan from what it holds (lock held)."""
        name = sw.name
        ports = {(s, p) for s, p in self._ports_down if s != name}
        ports |= {(name, p) for p in sw.seen_down if (name, p) in self.link_of_port}
        self._set_ports_down(ports, f"{name} connected", reconciling=name)
        adopted = self._adopt(name, sw.seen_flows)
        installed = SwitchPlan(tuple(sw.seen_groups), tuple(sw.seen_flows))
        wanted = plan.renumber_groups(sw.seen_groups, plan.switch_plan(
            name, self.routes[name], self.topo["hosts"], self.policy))
        extra = [plan.watch_entry(w) for w in self._watched.values()]
        extra += [plan.pin_entry(p) for p in self._pinned.values() if p.switch == name]
        extra += [e for e in sw.seen_flows if self._still_valid_decision(name, e)]
        changes = plan.plan_changes(installed, SwitchPlan(wanted.groups,
                                                          wanted.flows + tuple(extra)))
        self._send_changes(sw, changes, {g.group_id for g in sw.seen_groups})
        self._installed[name] = wanted
        seen = {plan.entry_key(e) for e in sw.seen_flows}
        replaced = sum(1 for e in changes.flows_add if plan.entry_key(e) in seen)
        kept = len(sw.seen_flows) - len(changes.flows_delete) - replaced
        self._remember(self._resyncs, {"t": time.time(), "switch": name, "found": len(
            sw.seen_flows), "kept": kept, "adopted": adopted, **changes.counts()})
        self._send_barrier(sw, lambda ok, why: self._programmed(sw, ok, why))
        LOG.info("%s: %d entries found, %d kept, %s, adopted %s", name, len(sw.seen_flows),
                 kept, changes.counts(), adopted)

    def _adopt(self, name: str, found: list[FlowEntry]) -> dict[str, int]:
        """Counters and placements the lab asked a predecessor for: the switch remembers."""
        watches = pins = 0
        for e in found:
            w = plan.watch_of(e)
            if w is not None and w.cookie not in self._watched:
                self._watched[w.cookie] = w
                watches += 1
            key = plan.key_of_match(e.match)
            if (e.table == plan.TABLE_FORWARD and e.priority == plan.PRIO_PIN and key
                    and e.action.kind == "output" and e.action.arg in self.ports_of[name]
                    and (name, key) not in self._pinned):
                self._pinned[(name, key)] = Pin(name, key, e.action.arg)
                pins += 1
        return {"watches": watches, "pins": pins}

    def _still_valid_decision(self, name: str, entry: FlowEntry) -> bool:
        """A per-flow decision found in the switch that still leads to its destination."""
        if entry.table != plan.TABLE_FORWARD or entry.priority != plan.PRIO_FLOW \
                or entry.action.kind != "output":
            return False
        key = plan.key_of_match(entry.match)
        host = self.host_by_ip.get(key.dst) if key else None
        return host is not None and entry.action.arg in self.routes[name].get(host.name, [])

    def _send_changes(self, sw: _Switch, changes: plan.PlanChanges,
                      existing_groups: set[int]) -> None:
        """Make before break (see ``plan.PlanChanges``); the caller sends the barrier."""
        dp = sw.dp
        for g in changes.groups_add:
            dp.send_msg(openflow.add_group(dp, g, modify=g.group_id in existing_groups))
        for e in changes.flows_add:
            dp.send_msg(openflow.add_flow(dp, e))
        for e in changes.flows_delete:
            dp.send_msg(openflow.delete_flow_strict(dp, e))
        for g in changes.groups_delete:
            dp.send_msg(openflow.delete_group(dp, g))

    # -- link failures: port status, reroute ------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev: Any) -> None:
        msg = ev.msg
        name = self.by_dpid.get(msg.datapath.id)
        port = msg.desc.port_no
        down = openflow.port_is_down(msg.datapath.ofproto, msg.desc)
        with self._lock:
            if name is None or (name, port) not in self.link_of_port:
                return                        # a host's port: no other way to reach it
            if ((name, port) in self._ports_down) == down:
                return
            self._remember(self._link_events, {"t": time.time(), "switch": name,
                                               "port": port, "up": not down})
            ports = set(self._ports_down)
            (ports.add if down else ports.discard)((name, port))
            self._set_ports_down(ports, f"{name} port {port} {'down' if down else 'up'}")

    def _set_ports_down(self, ports: set[tuple[str, int]], why: str,
                        reconciling: str | None = None) -> None:
        """Record which fabric ports are down; reroute if that changes a link (lock held).

        A link is out when either end is down: a veth whose peer is down carries nothing.
        """
        self._ports_down = ports
        links = frozenset(self.link_of_port[p] for p in ports)
        if links == self._down_links:
            return
        t_event = time.time()
        self._down_links = links
        old_routes = self.routes
        self.routes = routing.ecmp_routes(plan.topology_without(self.topo, set(links)))
        # Switches still reading back reconcile against the new routes when they are done.
        targets = [sw for sw in self._switches.values()
                   if not sw.waiting and sw.name != reconciling]
        record: dict[str, Any] = {"t_event": t_event, "why": why,
                                  "down_links": self.down_link_names(),
                                  "switches": len(targets), "confirmed": 0, "t_done": None}
        self._remember(self._reroutes, record)
        total: dict[str, int] = {}
        n = len(targets)
        for sw in targets:
            for k, v in self._reroute_switch(sw, old_routes).items():
                total[k] = total.get(k, 0) + v
            self._send_barrier(sw, lambda ok, why, r=record: self._rerouted(r, n, ok, why))
        record["changes"] = total
        if not targets:
            record["t_done"] = time.time()
        LOG.warning("reroute (%s): links down %s; %s", why, record["down_links"], total)

    def _reroute_switch(self, sw: _Switch, old_routes: routing.Routes) -> dict[str, int]:
        name = sw.name
        installed = self._installed[name]
        wanted = plan.renumber_groups(installed.groups, plan.switch_plan(
            name, self.routes[name], self.topo["hosts"], self.policy))
        changes = plan.plan_changes(installed, wanted)
        self._send_changes(sw, changes, {g.group_id for g in installed.groups})
        self._installed[name] = wanted
        # Per-flow decisions and placements through a port that no longer leads to their
        # destination: deleted (a flow policy decides again on the flow's next packet).
        stale = 0
        for host in self.topo["hosts"]:
            lost = set(old_routes[name].get(host["name"], [])) - \
                set(self.routes[name].get(host["name"], []))
            for port in sorted(lost):
                sw.dp.send_msg(openflow.delete_by_out_port(
                    sw.dp, plan.TABLE_FORWARD, {"eth_type": plan.ETH_TYPE_IPV4,
                                                "ipv4_dst": host["ip"]}, port))
                stale += 1
            if lost:
                for key, pin in list(self._pinned.items()):
                    if pin.switch == name and pin.key.dst == host["ip"] and pin.port in lost:
                        del self._pinned[key]
        return {**changes.counts(), "stale_decision_sweeps": stale}

    def _rerouted(self, record: dict[str, Any], expected: int, ok: bool, why: str) -> None:
        with self._lock:
            record["confirmed"] += 1
            if not ok:
                record.setdefault("errors", []).append(why)
            if record["confirmed"] == expected:
                record["t_done"] = time.time()
                LOG.warning("reroute confirmed by %d switches in %.0f ms", expected,
                            (record["t_done"] - record["t_event"]) * 1000)

    def down_link_names(self) -> list[str]:
        return sorted(f"{self.cfg.links[i].a}-{self.cfg.links[i].b}" for i in self._down_links)

    @staticmethod
    def _remember(history: list[dict[str, Any]], item: dict[str, Any]) -> None:
        history.append(item)
        del history[:-HISTORY]

    def _programmed(self, sw: _Switch, ok: bool, why: str) -> None:
        with self._lock:
            if self._switches.get(sw.name) is not sw:
                return                        # superseded by a newer connection
            sw.state = "programmed" if ok else "error"
        ms = (time.monotonic() - sw.since) * 1000
        if ok:
            LOG.info("%s programmed in %.0f ms", sw.name, ms)
        else:
            LOG.error("%s NOT programmed: %s", sw.name, why)

    @set_ev_cls(ofp_event.EventOFPBarrierReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _barrier_reply(self, ev: Any) -> None:
        with self._lock:
            pend = self._pending.pop((ev.msg.datapath, ev.msg.xid), None)
            new_errors = pend.switch.errors[pend.errors_before:] if pend else []
        if pend is not None:
            pend.done(not new_errors, "; ".join(new_errors))

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _error_msg(self, ev: Any) -> None:
        msg = ev.msg
        text = f"OpenFlow error type={msg.type} code={msg.code}"
        with self._lock:
            sw = self._current(msg.datapath)
            if sw is not None:
                sw.errors.append(text)
        LOG.error("%s: %s (xid %s)", sw.name if sw else msg.datapath.address, text, msg.xid)

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state_change(self, ev: Any) -> None:
        if ev.state != DEAD_DISPATCHER:
            return
        dp = ev.datapath
        with self._lock:
            sw = self._current(dp)
            if sw is not None:
                del self._switches[sw.name]
            orphans = [self._pending.pop(k) for k in list(self._pending) if k[0] is dp]
        for pend in orphans:
            pend.done(False, f"{pend.switch.name} disconnected")
        if sw is not None:
            LOG.warning("%s disconnected", sw.name)

    # -- port load, for policies that place by it ---------------------------------------------
    def _poll_ports(self) -> None:
        """Ask every programmed switch for its port counters, every policy interval."""
        while True:
            hub.sleep(self.policy.port_stats_interval)
            with self._lock:
                dps = [sw.dp for sw in self._switches.values() if sw.state == "programmed"]
            for dp in dps:
                dp.send_msg(openflow.port_stats_request(dp))

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def _port_stats(self, ev: Any) -> None:
        name = self.by_dpid.get(ev.msg.datapath.id)
        if name is None:
            return
        now = time.monotonic()
        counts = {s.port_no: s.tx_bytes for s in ev.msg.body
                  if s.port_no in self.ports_of.get(name, ())}
        with self._lock:
            last = self._port_bytes.get(name)
            self._port_bytes[name] = (now, counts)
            if last is None or now - last[0] <= 0:
                return
            dt = now - last[0]
            rates = {p: max(0, b - last[1].get(p, b)) * 8 / dt for p, b in counts.items()}
            self.policy.observe_ports(name, rates)
            self._port_samples += 1

    # -- reactive per-flow decisions ---------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def _packet_in(self, ev: Any) -> None:
        msg = ev.msg
        dp = msg.datapath
        key = flow_key_of(msg.data)
        with self._lock:
            sw = self._current(dp)
        if sw is None or key is None or self.policy.granularity == "switch":
            return
        host = self.host_by_ip.get(key.dst)
        gateway = None
        if host is None:                      # off-fabric: towards the gateway it is sent to
            gateway = self.gateway_by_mac.get(frame_dst_mac(msg.data))
        elif self.policy.granularity != "flow":
            return                            # pair policies route hosts proactively
        target = host or gateway
        ports = self.routes[sw.name].get(target.name, []) if target else []
        if not ports:
            return                            # not ours to route: dropped
        entry: FlowEntry
        if self.policy.granularity == "pair":
            assert gateway is not None
            pair = FlowKey(key.src, key.dst, 0, 0, 0)
            port = ports[0] if len(ports) == 1 else self.policy.choose(pair, sw.name, ports)
            entry = plan.reactive_pair_entry(key.src, key.dst, gateway.mac, port)
        else:
            with self._lock:              # stateful policies: one decision at a time
                port = ports[0] if len(ports) == 1 else self.policy.choose(key, sw.name, ports)
                self.policy.placed(key, sw.name, port, None)
            entry = plan.reactive_entry(key, port, self.policy.idle_timeout)
        with self._lock:
            if self._switches.get(sw.name) is not sw:
                return
            dp.send_msg(openflow.add_flow(dp, entry))
            dp.send_msg(openflow.packet_out(dp, msg.match["in_port"], port, msg.data))
            self._decisions += 1
        LOG.debug("%s: %s %s:%d -> %s:%d -> port %d of %s", sw.name, key.proto, key.src,
                  key.sport, key.dst, key.dport, port, ports)
