"""The failover phases on the running edge: a link or a border router cut silently
mid-phase and restored later, and a watch on a router's kernel route that times how long
BFD and BGP took to take the path away and to bring it back.

``EdgeFailover`` is the part of ``lab.kinds.streaming.run.EdgeRun`` that does this.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from lab.measure import routerstats
from lab.measure.routerstats import RouterPort
from lab.net import edgecontrol
from lab.net.edge import CORE


class EdgeFailover:
    """A phase's cut and restore on the running edge (a part of ``EdgeRun``)."""

    params: dict[str, Any]
    desc: dict[str, Any]
    routers: dict[str, Any]
    rports: list[RouterPort]

    def failover(self, phase: str, config: dict[str, Any], t0_unix: float) -> dict[str, Any]:
        """Cut mid-phase, watch the routes go and come back; returns the times measured."""
        f = self.params["failover"]
        if phase == "failover-link":
            # The uplink carrying the most big streams, and the border whose route uses it.
            pred = config.get("predicted_uplink", {})
            counts: dict[str, int] = {}
            for sid, up in pred.items():
                if "/big" in sid:
                    counts[up] = counts.get(up, 0) + 1
            target = max(sorted(counts), key=lambda u: counts[u])
            port = next(p for p in self.rports if p.name == target)
            cuts = [(port.node, [port.intf]), (port.peer, [port.peer_intf])]
            watcher = (port.node, self.dst_prefix("cdn1"), port.intf)
            what = target
        else:
            border = "border1"
            mine = [p for p in self.rports if p.node == border]
            cuts = [(border, [p.intf for p in mine])]
            by_peer: dict[str, list[str]] = {}
            for p in mine:
                by_peer.setdefault(p.peer, []).append(p.peer_intf)
            cuts += list(by_peer.items())
            core_port = next(p for p in self.rports if p.node == CORE and p.peer == border)
            watcher = (CORE, self.dst_prefix("cdn1"), core_port.intf)
            what = border
        node, prefix, dev = watcher
        watch = RouteWatch(self.routers[node], prefix, dev)
        watch.start()
        time.sleep(max(0.0, t0_unix + f["cut_at"] - time.time()))
        t_cut = time.time()
        for name, intfs in cuts:
            edgecontrol.cut(self.routers[name], intfs)
        time.sleep(max(0.0, t0_unix + f["restore_at"] - time.time()))
        t_restore = time.time()
        for name, _ in cuts:
            edgecontrol.restore(self.routers[name])
        back_deadline = time.time() + 15
        while watch.back_at is None and time.time() < back_deadline:
            time.sleep(0.05)
        watch.stop()
        return {"cut": what, "watched_router": node, "watched_prefix": prefix,
                "watched_dev": dev, "cut_unix": t_cut, "restore_unix": t_restore,
                "phase_start_unix": t0_unix,
                "withdrawn_after_s": None if watch.gone_at is None
                else round(watch.gone_at - t_cut, 3),
                "returned_after_s": None if watch.back_at is None
                else round(watch.back_at - t_restore, 3)}

    def dst_prefix(self, host: str) -> str:
        ln = next(x for x in self.desc["router_links"] if x["b"] == host)
        return ln["subnet"]


class RouteWatch(threading.Thread):
    """Polls a router's kernel route for ``prefix``: when ``dev`` leaves it and comes back."""

    def __init__(self, node: Any, prefix: str, dev: str, period_s: float = 0.01) -> None:
        super().__init__(daemon=True, name="fabriclab-route-watch")
        self.pid, self.prefix, self.dev, self.period = node.pid, prefix, dev, period_s
        self.gone_at: float | None = None
        self.back_at: float | None = None
        self._stop_evt = threading.Event()

    def run(self) -> None:
        while not self._stop_evt.wait(self.period):
            out = routerstats.ns_run(self.pid, ["ip", "-j", "route", "show", "exact",
                                                self.prefix], check=False).stdout
            try:
                routes = json.loads(out) if out.strip() else []
            except ValueError:
                continue
            devs = [nh.get("dev") for r in routes for nh in r.get("nexthops", [r])]
            now = time.time()
            if self.dev not in devs and self.gone_at is None:
                self.gone_at = now
            elif self.dev in devs and self.gone_at is not None and self.back_at is None:
                self.back_at = now

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=5)
