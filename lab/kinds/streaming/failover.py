"""The failover phases on the running edge: a link or a border router cut silently
mid-phase and restored later, and a watch on a router's kernel route that times how long
BFD and BGP took to take the path away and to bring it back.

``EdgeFailover`` is the part of ``lab.kinds.streaming.run.EdgeRun`` that does this.
"""

from __future__ import annotations

import time
from typing import Any

from lab.measure.routerstats import RouterPort
from lab.measure.routewatch import RouteWatch
from lab.net import edgecontrol
from lab.net.edge import CORE


class EdgeFailover:
    """A phase's cut and restore on the running edge (a part of ``EdgeRun``)."""

    params: dict[str, Any]
    desc: dict[str, Any]
    routers: dict[str, Any]
    rports: list[RouterPort]

    def failover(self, phase: str, config: dict[str, Any], t0_unix: float,
                 streams_unix: float) -> dict[str, Any]:
        """Cut ``cut_at`` s after the streams started (``streams_unix``), restore at
        ``restore_at``, watch the routes go and come back; returns the times measured."""
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
        watch = RouteWatch(self.routers[node].pid, prefix, dev)
        watch.start()
        time.sleep(max(0.0, streams_unix + f["cut_at"] - time.time()))
        t_cut = time.time()
        for name, intfs in cuts:
            edgecontrol.cut(self.routers[name], intfs)
        time.sleep(max(0.0, streams_unix + f["restore_at"] - time.time()))
        t_restore = time.time()
        for name, _ in cuts:
            edgecontrol.restore(self.routers[name])
        back_deadline = time.time() + 15
        while watch.back_at is None and time.time() < back_deadline:
            time.sleep(0.05)
        watch.stop()
        return {"cut": what, "watched_router": node, "watched_prefix": prefix,
                "watched_dev": dev, "cut_unix": t_cut, "restore_unix": t_restore,
                "phase_start_unix": t0_unix, "streams_unix": streams_unix,
                "withdrawn_after_s": None if watch.gone_at is None or watch.error
                else round(watch.gone_at - t_cut, 3),
                "returned_after_s": None if watch.back_at is None or watch.error
                else round(watch.back_at - t_restore, 3),
                "watch_error": watch.error}

    def dst_prefix(self, host: str) -> str:
        ln = next(x for x in self.desc["router_links"] if x["b"] == host)
        return ln["subnet"]
