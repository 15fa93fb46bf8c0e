"""The lab's requests to the running controller, on its control socket: status, watch
(per-flow counters), pin (a flow's path), jobs (which job a flow is, for a job-aware
policy), ecn (marking per port), ecn_stats and pfc (the PFC engine started on a config, or
stopped with its counters).

A mixin of ``FabricApp``: the requests arrive on the control server's threads and act on
the app's switches under its lock; kept apart from the OpenFlow event handling they share
that state with.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from controllers import openflow, plan
from controllers.marking import PortQueue, parse_marking
from controllers.plan import FlowEntry, RequestError, Watch
from controllers.runtime import RUNTIME_NAME, RUNTIME_VERSION, hub

LOG = logging.getLogger("fabriclab.app")
#: How long a watch waits for every switch's barrier reply before answering.
WATCH_BARRIER_TIMEOUT_S = 10.0


class ControlRequests:
    """What the lab may ask of the controller (mixed into ``FabricApp``)."""

    _lock: Any
    _switches: dict[str, Any]
    _pfcd: Any
    _pfc_lock: Any
    cfg: Any
    policy: Any

    def handle_request(self, req: dict[str, Any]) -> dict[str, Any]:
        cmd = req.get("cmd")
        if cmd == "status":
            return self.status()
        handlers = {"watch": lambda: self.watch(req.get("flows")),
                    "pin": lambda: self.pin(req.get("flows")),
                    "jobs": lambda: self.jobs(req.get("flows")),
                    "queues": lambda: self.queues_sample(req.get("ports"),
                                                         req.get("threshold_bytes")),
                    "ecn": lambda: self.ecn(req.get("ports")),
                    "ecn_stats": self.ecn_stats,
                    "pfc": lambda: self.pfc(req.get("config"), req.get("off"))}
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
            queue_samples, moves = self._queue_samples, [dict(m) for m in self._moves]
            down = self.down_link_names()
            history = {"link_events": [dict(e) for e in self._link_events],
                       "reroutes": [dict(r) for r in self._reroutes],
                       "resyncs": [dict(r) for r in self._resyncs]}
        switches = {s.name: states.get(s.name, "absent") for s in self.cfg.switches}
        return {"ok": True, "runtime": RUNTIME_NAME, "runtime_version": RUNTIME_VERSION,
                "policy": self.policy.name, "seed": self.cfg.seed, "switches": switches,
                "ready": all(v == "programmed" for v in switches.values()),
                "errors": errors, "watched": watched, "decisions": decisions,
                "port_samples": port_samples, "queue_samples": queue_samples,
                "moves": moves, "down_links": down, **history}

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
                                 [plan.watch_entry(w) for w in by_cookie.values()]
                                 + self._decided_ahead(sw.name, by_cookie.values()))
                       for sw in targets}
        failed = self._apply(targets, changes)
        if failed:
            return {"ok": False, "error": "watch: " + "; ".join(failed)}
        LOG.info("watching %d flows on %d switches", len(by_cookie), len(targets))
        return {"ok": True, "installed": len(by_cookie) * len(targets)}

    def _decided_ahead(self, switch: str, watches: Iterable[Watch]) -> list[FlowEntry]:
        """The per-flow entries a ``decides_ahead`` policy would install on packet-in, for
        the announced TCP/UDP flows whose destination ``switch`` reaches by several ports.
        Called with the lock held (it counts the decisions)."""
        if self.policy.granularity != "flow" or not self.policy.decides_ahead:
            return []
        out = []
        for w in watches:
            host = self.host_by_ip.get(w.key.dst)
            if host is None or w.key.proto not in (plan.PROTO_TCP, plan.PROTO_UDP):
                continue
            ports = self.routes[switch].get(host.name, [])
            if len(ports) > 1:
                port = self.policy.choose(w.key, switch, ports)
                out.append(plan.reactive_entry(w.key, port, self.policy.idle_timeout))
                self._decisions += 1              # a decision like a packet-in's, taken early
                LOG.debug("%s: %s %s:%d -> %s:%d -> port %d of %s (decided ahead)", switch,
                          w.key.proto, w.key.src, w.key.sport, w.key.dst, w.key.dport, port,
                          ports)
        return out

    def _apply(self, targets: list[Any],
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

    def jobs(self, flows: Any) -> dict[str, Any]:
        """Tell a job-aware policy which job each 5-tuple belongs to (``{"job": id}`` beside
        a watch's 5-tuple fields); the whole table, so an empty list forgets every job.
        Sent before the flows are watched, so decisions taken ahead see it."""
        if not isinstance(flows, list):
            raise RequestError("flows: expected a list")
        observe = getattr(self.policy, "observe_jobs", None)
        if observe is None:
            raise RequestError(f"policy {self.policy.name!r} is not job-aware (it has no "
                               "observe_jobs)")
        table = {}
        for i, f in enumerate(flows):
            where = f"flows[{i}]"
            job = f.get("job") if isinstance(f, dict) else None
            if not isinstance(job, str) or not job:
                raise RequestError(f"{where}.job: expected a job id")
            table[plan.parse_watch({**f, "cookie": 1}, where).key] = job
        with self._lock:
            observe(table)
        LOG.info("jobs: %d flows of %d jobs", len(table), len(set(table.values())))
        return {"ok": True, "flows": len(table), "jobs": len(set(table.values()))}

    def queues_sample(self, ports: Any, threshold: Any) -> dict[str, Any]:
        """One sample of the switch ports' queues ({intf: backlog bytes}) for a policy that
        places by them (``observes_queues``); the flows it moves are moved at once."""
        observe = getattr(self.policy, "observe_queues", None)
        if observe is None:
            raise RequestError(f"policy {self.policy.name!r} does not read queues (it has "
                               "no observe_queues)")
        if not isinstance(ports, dict):
            raise RequestError("ports: expected {intf: backlog bytes}")
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold <= 0:
            raise RequestError("threshold_bytes: expected a positive int")
        by_switch: dict[str, dict[int, int]] = {}
        for intf, q in ports.items():
            p = self.queues.get(intf)
            if p is not None and isinstance(q, int):
                by_switch.setdefault(p.switch, {})[p.port] = q
        moved = []
        with self._lock:
            now = time.monotonic()
            for name, backlog in sorted(by_switch.items()):
                sw = self._switches.get(name)
                for key, old, new in observe(name, backlog, threshold):
                    if sw is not None and sw.state == "programmed":
                        sw.dp.send_msg(openflow.add_flow(sw.dp, plan.reactive_entry(
                            key, new, self.policy.idle_timeout)))
                    moved.append({"t": now, "switch": name, "from": old, "to": new,
                                  "flow": [key.src, key.sport, key.dst, key.dport,
                                           key.proto]})
            self._queue_samples += 1
            self._moves += moved
        for m in moved:
            LOG.info("%s: moved %s off port %d (queue above %d B) to %d", m["switch"],
                     m["flow"], m["from"], threshold, m["to"])
        return {"ok": True, "moved": len(moved)}

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
                    marking = parse_marking(rest, where)
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
                marker.set(PortQueue(q.intf, q.rate_bps, q.limit_bytes), marking)
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

    # -- PFC -------------------------------------------------------------------------------
    def pfc(self, config: Any, off: Any) -> dict[str, Any]:
        """Start pfcd on ``config`` (``controllers.pfc.PfcConfig``'s JSON form), or stop it
        (``off``: true) and reply its counters.

        One pfcd at a time: a start is refused while one runs. Its binary is built in the
        build dir (as the ECN marker's object is); its config, counters and stderr go beside
        the control socket, in the run's directory. Starting and stopping hold their own
        lock, not the app's: pfcd takes up to seconds to be ready, and OpenFlow events
        must not wait for it.
        """
        from controllers import pfc as pfc_mod  # only runs with PFC asked for
        if (off is True) == (config is not None) or off not in (None, True):
            raise RequestError('expected "config": {...} to start pfcd or "off": true to '
                               "stop it")
        with self._pfc_lock:
            if off is True:
                if self._pfcd is None:
                    raise RequestError("off: pfcd is not running")
                try:
                    return {"ok": True, "counters": self._pfc_stopped()}
                except (ValueError, RuntimeError) as exc:
                    return {"ok": False, "error": f"pfc: {exc}"}
            if self._pfcd is not None and self._pfcd.running:
                raise RequestError(f"pfcd is already running (pid {self._pfcd.pid}); "
                                   'stop it first ("off": true)')
            try:
                cfg = pfc_mod.PfcConfig.from_dict(config, "config")
            except ValueError as exc:
                raise RequestError(str(exc)) from None
            self.stop_pfc()               # one that died: its classes set back, then gone
            work = Path(self.cfg.control_socket).parent
            try:
                # cbuild's own cache, not the BPF objects' build_dir (under /run, which
                # is noexec on systemd machines: a program there cannot run)
                binary = pfc_mod.Pfcd.build()
                engine = pfc_mod.Pfcd(cfg, binary, work / "pfcd.json", work / "pfcd.log")
                engine.start()
            except (ValueError, RuntimeError) as exc:
                return {"ok": False, "error": f"pfc: {exc}"}
            self._pfcd = engine
        LOG.info("pfc: pfcd %d watches %d ports, pauses %d classes", engine.pid,
                 len(cfg.ports), len(cfg.feeders()))
        return {"ok": True, "pid": engine.pid, "watched": len(cfg.ports),
                "feeders": len(cfg.feeders())}

    def _pfc_stopped(self) -> dict[str, Any]:
        """Stop pfcd (it sets its classes back) and forget it, whatever stop says."""
        engine, self._pfcd = self._pfcd, None
        counters = engine.stop()
        LOG.info("pfc: pfcd %d stopped", engine.pid)
        return counters

    def stop_pfc(self) -> None:
        """Stop a pfcd that runs, or set back the classes of one that died: the controller
        never leaves a port paused behind it (its shutdown calls this)."""
        if self._pfcd is None:
            return
        try:
            self._pfc_stopped()
        except (ValueError, RuntimeError) as exc:
            LOG.warning("pfc: %s", exc)
