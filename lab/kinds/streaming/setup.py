"""How the running edge is set up for a phase: the uplinks' rate, the routers' hash and its
seeds per tier (searched by asking the kernel where each stream would go), and, for
``fix-placement``, each big stream pinned to the least-loaded uplink.

``EdgeSetup`` is the part of ``lab.kinds.streaming.run.EdgeRun`` that does this; it reads
the run's routers and ports, which ``EdgeRun`` holds.
"""

from __future__ import annotations

from typing import Any

from lab.kinds.streaming.plan import ORIGIN_ROLES, Stream
from lab.measure.routerstats import RouterPort
from lab.net import edgecontrol
from lab.net.edge import CORE
from lab.net.edgecontrol import FiveTuple
from lab.net.links import change_rate

#: dccore's interface on the fabric (its port 0): where origin streams enter the routers.
CORE_FABRIC_INTF = f"{CORE}-eth0"
#: A seed search stops at the first seed pair whose predicted hottest uplink stays below
#: this share of its rate.
SEED_TARGET_UTIL = 0.7
SEED_TRIES = 64


class EdgeSetup:
    """A phase's routing set-up on the running edge (a part of ``EdgeRun``)."""

    params: dict[str, Any]
    desc: dict[str, Any]
    streams: list[Stream]
    routers: dict[str, Any]
    rports: list[RouterPort]
    port_at: dict[tuple[str, str], RouterPort]
    base_seeds: dict[str, int]
    pinned: dict[str, list[int]]
    uplink_bw: float

    def configure(self, phase: str, measured: dict[str, float]) -> dict[str, Any]:
        """Rates, hash and placement for ``phase``; returns what was set, for the report."""
        tp = self.desc["params"]
        bw = self.params["before"]["uplink_bw"] if phase == "before-upgrade" \
            else tp["uplink_bw"]
        self.set_uplink_bw(bw)
        for name, tables in self.pinned.items():
            edgecontrol.unpin(self.routers[name], tables)
        self.pinned = {}
        config: dict[str, Any] = {"uplink_bw_mbps": bw}
        mine = [n for n in self.routers if not n.startswith("isp")]
        if phase in ("fix-hash", "failover-link", "failover-border"):
            config.update(self.seed_search(phase, bw))
        else:
            held = {name: edgecontrol.set_hash(node, "l3", self.base_seeds[name])
                    for name, node in self.routers.items()}
            config["hash"] = {n: {"mode": "l3", "seed": held[n]["seed"]} for n in mine}
        if phase == "fix-placement":
            config["placement"] = self.place_by_load(phase, measured)
        return config

    def set_uplink_bw(self, bw: float) -> None:
        for p in self.rports:
            if p.role == "uplink":
                change_rate(self.routers[p.node], p.intf, bw, "topology.uplink_bw")
        self.uplink_bw = bw

    def egress(self, phase: str) -> list[Stream]:
        """The phase's streams leaving through the edge: the origin's."""
        return [s for s in self.streams if s.phase == phase and s.role in ORIGIN_ROLES]

    def peer_of(self, node: str, intf: str) -> tuple[str, str]:
        p = self.port_at[(node, intf)]
        return p.peer, p.peer_intf

    def predict_uplinks(self, streams: list[Stream]) -> dict[str, str]:
        """stream id -> the uplink (``border-ethX->isp-ethY``) the kernel would choose."""
        first = edgecontrol.predict(self.routers[CORE], CORE_FABRIC_INTF,
                                    [s.tuple for s in streams])
        by_border: dict[tuple[str, str], list[Stream]] = {}
        for s, dev in zip(streams, first, strict=True):
            border, b_intf = self.peer_of(CORE, dev)
            by_border.setdefault((border, b_intf), []).append(s)
        out = {}
        for (border, b_intf), group in by_border.items():
            devs = edgecontrol.predict(self.routers[border], b_intf, [s.tuple for s in group])
            for s, dev in zip(group, devs, strict=True):
                _, pintf = self.peer_of(border, dev)
                out[s.id] = f"{dev}->{pintf}"
        return out

    def seed_search(self, phase: str, bw: float) -> dict[str, Any]:
        """L4 hash everywhere we own; seeds per tier tried until the elephants spread."""
        streams = self.egress(phase)
        best: tuple[float, int, dict[str, str]] | None = None
        seedable = True
        for attempt in range(SEED_TRIES):
            for name, node in self.routers.items():
                if not name.startswith("isp"):
                    held = edgecontrol.set_hash(node, "l4", self.tier_seed(name, attempt))
                    seedable = held["seed"] is not None
            pred = self.predict_uplinks(streams)
            load: dict[str, float] = {}
            for s in streams:
                load[pred[s.id]] = load.get(pred[s.id], 0.0) + s.rate_mbps
            hottest = max(load.values(), default=0.0) / bw
            if best is None or hottest < best[0]:
                best = (hottest, attempt, pred)
            if hottest <= SEED_TARGET_UTIL or not seedable:   # no seed: one hash to try
                break
        assert best is not None
        hottest, attempt, pred = best
        seeds = {}
        for name, node in self.routers.items():
            if not name.startswith("isp"):       # the ISPs are not ours: they keep L3
                held = edgecontrol.set_hash(node, "l4", self.tier_seed(name, attempt))
                seeds[name] = {"mode": "l4", "seed": held["seed"]}
        return {"hash": seeds, "seed_tries": attempt + 1, "seedable": seedable,
                "predicted_uplink": pred, "predicted_hottest_util": round(hottest, 3)}

    def tier_seed(self, name: str, attempt: int) -> int:
        """The seed a router of ours gets in seed-search ``attempt``: dccore and the borders
        step differently, so the two tiers never share a seed (the same hash at two tiers
        polarises: a border would send all it gets from one dccore bucket to one uplink)."""
        if name == CORE:
            return self.base_seeds[name] + attempt
        return self.base_seeds[name] + 7 * attempt + 1

    def place_by_load(self, phase: str, measured: dict[str, float]) -> dict[str, str]:
        """Greedy: biggest measured stream first, each onto the least-loaded uplink."""
        streams = self.egress(phase)
        twin = {s.id.split("/", 1)[1]: s for s in self.egress("incident")}
        uplinks = [p for p in self.rports if p.role == "uplink" and p.node.startswith("border")]
        load = {p.name: 0.0 for p in uplinks}
        core_rules: list[tuple[FiveTuple, str, str]] = []
        border_rules: dict[str, list[tuple[FiveTuple, str, str]]] = {}
        placed = {}

        def rate(s: Stream) -> float:
            t = twin.get(s.id.split("/", 1)[1])
            return measured.get(t.id, s.rate_mbps) if t else s.rate_mbps

        for s in sorted(streams, key=rate, reverse=True):
            isp = self.isp_of(s.dst)
            choices = [p for p in uplinks if p.peer == isp]
            best = min(choices, key=lambda p: (load[p.name], p.name))
            load[best.name] += rate(s)
            placed[s.id] = best.name
            core_link = next(p for p in self.rports if p.node == CORE and p.peer == best.node)
            core_rules.append((s.tuple, core_link.intf, self.addr_of(best.node,
                                                                     core_link.peer_intf)))
            border_rules.setdefault(best.node, []).append(
                (s.tuple, best.intf, self.addr_of(best.peer, best.peer_intf)))
        self.pinned[CORE] = edgecontrol.pin(self.routers[CORE], core_rules)
        for border, rules in border_rules.items():
            self.pinned[border] = edgecontrol.pin(self.routers[border], rules)
        return placed

    def isp_of(self, host: str) -> str:
        for ln in self.desc["router_links"]:
            if ln["b"] == host:
                return ln["a"]
        raise KeyError(host)

    def addr_of(self, node: str, intf: str) -> str:
        r = next(x for x in self.desc["routers"] if x["name"] == node)
        return r["interfaces"][intf][0].split("/")[0]

