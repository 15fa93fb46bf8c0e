"""The FabricLab controller app: static L3 ECMP for a topology the lab describes exactly.

Why it is built this way:

- The topology comes from the lab's config, never from discovery: no LLDP, no flooding,
  no learning, so nothing the controller does adds traffic or timing of its own to a
  measurement.
- Every (re)connection of a switch is a clean resync (delete every flow and group, then
  program from scratch), so a switch that kept stale state across a controller restart or
  a reconnect cannot silently forward by it.
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
from pathlib import Path
from typing import Any, ClassVar

from controllers import config, openflow, plan, policies, routing
from controllers.control import ControlServer
from controllers.plan import FlowEntry, Pin, RequestError, Watch
from controllers.policies import FlowKey
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
WATCH_BARRIER_TIMEOUT_S = 10.0


@dataclass
class _Switch:
    """One connection of one configured switch (a reconnect is a new ``_Switch``)."""

    name: str
    dp: Any
    state: str = "connected"              # -> "programmed" | "error"
    since: float = field(default_factory=time.monotonic)
    errors: list[str] = field(default_factory=list)


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


class FabricApp(BaseApp):
    """Programs every configured switch and answers the lab on the control socket."""

    OFP_VERSIONS: ClassVar[list[int]] = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cfg = config.load_from_env()
        self.policy = policies.resolve(self.cfg.policy)(seed=self.cfg.seed)
        topo = self.cfg.topology()
        self.routes = routing.ecmp_routes(topo)
        self.plans = {sw: plan.switch_plan(sw, self.routes[sw], topo["hosts"], self.policy)
                      for sw in self.routes}
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
        self._decisions = 0
        # Last port counters per switch, for load-aware policies: {switch: (t, {port: bytes})}.
        self._port_bytes: dict[str, tuple[float, dict[int, int]]] = {}
        self._port_samples = 0              # measurements given to the policy (status)
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
        sw_plan = self.plans[name]
        with self._lock:
            old = self._switches.get(name)
            sw = _Switch(name, dp)
            self._switches[name] = sw
            watches = list(self._watched.values())
            pins = [p for p in self._pinned.values() if p.switch == name]
            for msg in openflow.delete_everything(dp):
                dp.send_msg(msg)
            dp.send_msg(openflow.barrier(dp))  # deletions done before anything is added
            for group in sw_plan.groups:
                dp.send_msg(openflow.add_group(dp, group))
            for entry in sw_plan.flows:
                dp.send_msg(openflow.add_flow(dp, entry))
            for watch in watches:
                dp.send_msg(openflow.add_flow(dp, plan.watch_entry(watch)))
            for pin in pins:
                dp.send_msg(openflow.add_flow(dp, plan.pin_entry(pin)))
            self._send_barrier(sw, lambda ok, why: self._programmed(sw, ok, why))
        LOG.info("%s (dpid %#x) %s: programming %d groups, %d entries, %d watch entries",
                 name, ev.msg.datapath_id, "reconnected" if old else "connected",
                 len(sw_plan.groups), len(sw_plan.flows), len(watches))

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

    # -- control requests (from the control server's threads) --------------------------------
    def handle_request(self, req: dict[str, Any]) -> dict[str, Any]:
        cmd = req.get("cmd")
        if cmd == "status":
            return self.status()
        handlers = {"watch": lambda: self.watch(req.get("flows")),
                    "pin": lambda: self.pin(req.get("flows")),
                    "ecn": lambda: self.ecn(req.get("ports")),
                    "ecn_stats": self.ecn_stats}
        if cmd not in handlers:
            return {"ok": False, "error": f"unknown cmd {cmd!r} (known: status, "
                                          f"{', '.join(handlers)})"}
        try:
            return handlers[cmd]()
        except RequestError as exc:
            return {"ok": False, "error": f"{cmd}: {exc}"}

    def status(self) -> dict[str, Any]:
        with self._lock:
            states = {name: sw.state for name, sw in self._switches.items()}
            errors = {name: sw.errors[-1] for name, sw in self._switches.items() if sw.errors}
            decisions, watched = self._decisions, len(self._watched)
            port_samples = self._port_samples
        switches = {s.name: states.get(s.name, "absent") for s in self.cfg.switches}
        return {"ok": True, "runtime": RUNTIME_NAME, "runtime_version": RUNTIME_VERSION,
                "policy": self.policy.name, "seed": self.cfg.seed, "switches": switches,
                "ready": all(v == "programmed" for v in switches.values()),
                "errors": errors, "watched": watched, "decisions": decisions,
                "port_samples": port_samples}

    def watch(self, flows: Any) -> dict[str, Any]:
        """Per-flow counters on every connected switch; replies after all their barriers."""
        if not isinstance(flows, list):
            raise RequestError("flows: expected a list")
        watches = [plan.parse_watch(f, f"flows[{i}]") for i, f in enumerate(flows)]
        by_cookie: dict[int, Watch] = {}
        for w in watches:
            if by_cookie.setdefault(w.cookie, w) != w:
                raise RequestError(f"cookie {w.cookie}: given twice for different flows")
        with self._lock:
            replaced = [old for c, w in by_cookie.items()
                        if (old := self._watched.get(c)) is not None and old != w]
            self._watched.update(by_cookie)
            targets = list(self._switches.values())
            changes = {sw.name: ([plan.watch_entry(o) for o in replaced],
                                 [plan.watch_entry(w) for w in by_cookie.values()])
                       for sw in targets}
        failed = self._apply(targets, changes)
        if failed:
            return {"ok": False, "error": "watch: " + "; ".join(failed)}
        LOG.info("watching %d flows on %d switches", len(by_cookie), len(targets))
        return {"ok": True, "installed": len(by_cookie) * len(targets)}

    def _apply(self, targets: list[_Switch],
               changes: dict[str, tuple[list[FlowEntry], list[FlowEntry]]]) -> list[str]:
        """Delete then add entries on each target switch; wait for every barrier reply.

        Returns what failed (empty: every switch confirmed every change).
        """
        replies = hub.Queue()
        with self._lock:
            for sw in targets:
                deletes, adds = changes.get(sw.name, ([], []))
                for entry in deletes:
                    sw.dp.send_msg(openflow.delete_flow_strict(sw.dp, entry))
                for entry in adds:
                    sw.dp.send_msg(openflow.add_flow(sw.dp, entry))
                self._send_barrier(sw, lambda ok, why, n=sw.name: replies.put((n, ok, why)))
        deadline = time.monotonic() + WATCH_BARRIER_TIMEOUT_S
        failed = []
        for _ in targets:
            try:
                name, ok, why = replies.get(timeout=max(0.0, deadline - time.monotonic()))
            except hub.QueueEmpty:
                failed.append(f"no barrier reply within {WATCH_BARRIER_TIMEOUT_S:g} s")
                break
            if not ok:
                failed.append(f"{name}: {why}")
        return failed

    def pin(self, flows: Any) -> dict[str, Any]:
        """Replace the set of placed flows: each 5-tuple leaves its switch by a given port.

        The request is the whole placement (an empty list removes every pin), so the lab
        can switch a job from hashing to placement and back between phases.
        """
        if not isinstance(flows, list):
            raise RequestError("flows: expected a list")
        pins = [plan.parse_pin(f, self.ports_of, f"flows[{i}]") for i, f in enumerate(flows)]
        wanted = {(p.switch, p.key): p for p in pins}
        if len(wanted) != len(pins):
            raise RequestError("flows: a 5-tuple is placed twice on one switch")
        with self._lock:
            old = self._pinned
            self._pinned = wanted
            targets = list(self._switches.values())
            changes = {sw.name: ([plan.pin_entry(p) for k, p in old.items()
                                  if k[0] == sw.name and wanted.get(k) != p],
                                 [plan.pin_entry(p) for k, p in wanted.items()
                                  if k[0] == sw.name and old.get(k) != p])
                       for sw in targets}
        failed = self._apply(targets, changes)
        if failed:
            return {"ok": False, "error": "pin: " + "; ".join(failed)}
        LOG.info("placed %d flow entries", len(wanted))
        return {"ok": True, "pinned": len(wanted)}

    # -- ECN marking -------------------------------------------------------------------------
    def ecn(self, ports: Any) -> dict[str, Any]:
        """Set (or turn off) ECN marking per egress port, at run time.

        ``ports`` is a list of {"intf": "leaf2-eth1", "k_bytes": K} (a step at K, as DCTCP
        wants), {"intf", "kmin_bytes", "kmax_bytes", "pmax"} (RED/DCQCN-style), or
        {"intf", "off": true}. Everything is checked before any port is touched.
        """
        from controllers import ecn as ecn_mod  # only runs with marking asked for
        if self.cfg.ecn_mechanism == "none":
            raise RequestError("this machine has no ECN marking mechanism")
        if not isinstance(ports, list) or not ports:
            raise RequestError("ports: expected a non-empty list")
        todo = []
        for i, item in enumerate(ports):
            where = f"ports[{i}]"
            if not isinstance(item, dict):
                raise RequestError(f"{where}: expected an object")
            intf = item.get("intf")
            if intf not in self.queues:
                raise RequestError(f"{where}.intf: no switch port {intf!r} in this fabric")
            rest = {k: v for k, v in item.items() if k != "intf"}
            if rest.get("off") is True and len(rest) == 1:
                marking = None
            else:
                try:
                    marking = ecn_mod.parse_marking(rest, where)
                except ValueError as exc:
                    raise RequestError(str(exc)) from None
            todo.append((self.queues[intf], marking))
        with self._lock:
            if self._marker is None:
                self._marker = ecn_mod.make_marker(self.cfg.ecn_mechanism,
                                                   Path(self.cfg.build_dir))
            marker = self._marker
        for q, marking in todo:
            try:
                marker.set(ecn_mod.PortQueue(q.intf, q.rate_bps, q.limit_bytes), marking)
            except ValueError as exc:
                return {"ok": False, "error": f"ecn: {exc}"}
            self._markings[q.intf] = None if marking is None else marking.__dict__
            LOG.info("ecn %s on %s: %s", marker.mechanism, q.intf, marking or "off")
        return {"ok": True, "mechanism": marker.mechanism, "marking": dict(self._markings)}

    def ecn_stats(self) -> dict[str, Any]:
        """The marker's own counters per port (CE marked, ECT seen, ...)."""
        counters = self._marker.counters() if self._marker is not None else {}
        return {"ok": True, "mechanism": self.cfg.ecn_mechanism, "ports": counters,
                "marking": dict(self._markings)}
