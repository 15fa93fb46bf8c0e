"""A lossless fabric's settings: the traffic classes every port carries, the RoCE
transport's options and PFC's thresholds, checked against a topology before anything
starts, and pfcd's configuration made from them.

Every kind that runs RoCE on the lab's switches shares these keys (``classes.*``,
``roce.*``, ``pfc.*``) and their checks: the roce kind's flow groups, and the collective
kind's ring on RoCE (``job.transport: roce``) beside another job's incast. One place, so a
threshold the roce kind refuses is refused the same way for a collective.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from controllers import pfc
from controllers.classes import LOSSLESS_PRIORITY, TrafficClasses
from lab.model.errors import ScenarioError
from lab.model.flows import FIXED_SPORTS, FlowSpec
from lab.model.scenario import Param

#: RoCE MTUs (payload per packet) the transport takes, and the IP packet each makes: IPv4
#: 20 + UDP 8 + BTH 12 + RETH 16 (a message's first packet) + ICRC 4 around the payload.
MTUS = (256, 512, 1024, 2048, 4096)
ROCE_HEADER_BYTES = 20 + 8 + 12 + 16 + 4
#: The lab's links carry 1500-byte IP packets.
LINK_MTU = 1500
#: How long pfcd may take to react, for the headroom rule: one poll interval (XOFF may be
#: crossed just after a poll) and half of one more for the dump and the class change
#: (measured p99 below 0.25 ms; controllers/pfc/README.md).
REACTION_POLLS = 1.5
#: A sprayed QP's source ports: a block of this many of its own, from a multiple of it.
SPRAY_BLOCK = 256


SCHEMA: dict[str, Param] = {
    "classes.weight": Param(float, 0.05, 0.95),
    "classes.lossless_bytes": Param(int, 3000, 1 << 28),
    "classes.lossy_bytes": Param(int, 3000, 1 << 28),
    # the hosts' NIC queues: a RoCE NIC's send queue never drops, so the lossless leaf of a
    # host's port holds every byte its QPs may have outstanding
    "classes.host_bytes": Param(int, 3000, 1 << 28),
    "roce.cc": Param(str, choices=("dcqcn", "none")),
    "roce.mtu": Param(int, 256, 4096),
    "roce.size_bytes": Param(int, 256, 1 << 24),
    "roce.tx_depth": Param(int, 1, 256),
    "roce.rto_ms": Param(float, 0.1, 10_000),
    # packet spraying: each QP's packets take SPRAY_BLOCK's first N UDP source ports in turn
    # (roce_bw and roce_ring --spray), so the switches' hash spreads one QP over the paths
    "roce.spray": Param(int, 1, SPRAY_BLOCK),
    # the receivers: RC's go-back-N (gbn) or out-of-order placement (ooo)
    "roce.placement": Param(str, choices=("gbn", "ooo")),
    # an ooo receiver NAKs a gap once this many packets arrived past it (a deeper
    # reordering than the paths' queues can make is a loss)
    "roce.reorder_pkts": Param(int, 1, 4095),
    "pfc.enabled": Param(bool),
    # the 802.1p priority PFC acts on: it must be the lossless class's
    "pfc.priority": Param(int, 0, 7),
    "pfc.xoff_bytes": Param(int, -(1 << 31), 1 << 31),
    "pfc.xon_bytes": Param(int, -(1 << 31), 1 << 31),
    "pfc.poll_us": Param(int, 100, 100_000),
    # what a paused class is held at, in % of its link (controllers/pfc/README.md: 5 % keeps
    # a port full with one frame leaked per pause)
    "pfc.pause_pct": Param(float, 0.5, 50),
}

DEFAULTS: dict[str, dict[str, Any]] = {
    "classes": {"weight": 0.5, "lossless_bytes": 150_000, "lossy_bytes": 150_000,
                "host_bytes": 2_000_000},
    # perftest's defaults where it has them (64 KB messages, tx depth 16 is ours: 128 is
    # ib_write_bw's, 8 MB a QP, far beyond a 50 Mbit/s port's buffer)
    "roce": {"cc": "none", "mtu": 1024, "size_bytes": 65536, "tx_depth": 16,
             "rto_ms": 64.0, "spray": 1, "placement": "gbn", "reorder_pkts": 64},
    "pfc": {"enabled": False, "priority": LOSSLESS_PRIORITY, "xoff_bytes": 30_000,
            "xon_bytes": 15_000, "poll_us": 1000, "pause_pct": 5.0},
}


def spray_blocks(count: int, used: set[int], rng: random.Random) -> list[int]:
    """``count`` first ports of SPRAY_BLOCK-port blocks of the fixed source ports, none of
    whose ports is in ``used``, drawn from ``rng``: a sprayed QP's source ports, each QP's
    its own, so no 5-tuple of one QP is another flow's."""
    if not count:
        return []
    start = -(-FIXED_SPORTS.start // SPRAY_BLOCK) * SPRAY_BLOCK
    free = [b for b in range(start, FIXED_SPORTS.stop - SPRAY_BLOCK + 1, SPRAY_BLOCK)
            if not any(b <= p < b + SPRAY_BLOCK for p in used)]
    return rng.sample(free, count)


def spray_subflows(flow: FlowSpec, spray: int) -> list[FlowSpec]:
    """A QP sprayed from ``flow.sport`` over ``spray`` ports: the 5-tuples after its own,
    each watched on the switches as a flow of its own (``subflow_of`` the QP), with no rate
    of its own: the QP's rate is the QP's."""
    return [replace(flow, id=f"{flow.id}~{e}", sport=flow.sport + e, result={},
                    rate_bps=0.0, subflow_of=flow.id) for e in range(1, spray)]


def check_netem(topo_desc: dict[str, Any], what: str) -> None:
    """Traffic classes replace a port's qdiscs, and a netem link's delay lives there."""
    for key in ("link_delay_ms", "link_jitter_ms", "link_loss_pct"):
        if topo_desc["params"].get(key):
            raise ScenarioError(f"topology.{key}", f"{what}'s traffic classes are built on "
                                "links without netem so far")


def classes_of(pp: dict[str, Any], host_port: bool = False,
               f: Callable[[str], str] = str) -> TrafficClasses:
    """The traffic classes of a switch port (or, ``host_port``, of a host's NIC); ``f``
    names a refused key as the user wrote it."""
    c = pp["classes"]
    try:
        return TrafficClasses(weight=c["weight"],
                              lossless_limit_bytes=c["host_bytes" if host_port
                                                     else "lossless_bytes"],
                              lossy_limit_bytes=c["lossy_bytes"])
    except ValueError as exc:
        field, _, why = str(exc).partition(": ")
        key = {"classes.lossless_limit_bytes": "classes.host_bytes" if host_port
               else "classes.lossless_bytes",
               "classes.lossy_limit_bytes": "classes.lossy_bytes"}.get(field, field)
        raise ScenarioError(f(key), why) from None


def check(topo_desc: dict[str, Any], pp: dict[str, Any], f: Callable[[str], str],
          outstanding: tuple[int, str], marking_on: bool) -> None:
    """What a phase's classes, transport and PFC must satisfy on this topology.

    ``outstanding``: the most one QP of the phase may have sent and not had acknowledged,
    and what makes it (it must fit in a host's lossless queue: a RoCE NIC's send queue
    never drops); ``marking_on``: whether the phase marks the lossless class (DCQCN reacts to
    nothing else); ``f`` names a key as the user wrote it
    (``lab.model.scenario.field_namer``)."""
    classes_of(pp, f=f)
    classes_of(pp, host_port=True, f=f)
    roce = pp["roce"]
    if roce["mtu"] not in MTUS:
        raise ScenarioError(f("roce.mtu"), f"{roce['mtu']} is not a RoCE MTU "
                            f"({', '.join(map(str, MTUS))})")
    if roce["mtu"] + ROCE_HEADER_BYTES > LINK_MTU:
        raise ScenarioError(f("roce.mtu"), f"a {roce['mtu']}-byte RoCE MTU makes "
                            f"{roce['mtu'] + ROCE_HEADER_BYTES}-byte IP packets, larger than "
                            f"the links' {LINK_MTU}")
    if outstanding[0] > pp["classes"]["host_bytes"]:
        raise ScenarioError(f("classes.host_bytes"), f"{pp['classes']['host_bytes']} B "
                            f"is below what one QP may have outstanding ({outstanding[1]} = "
                            f"{outstanding[0]} B): a host's NIC would drop")
    if roce["cc"] == "dcqcn" and not marking_on:
        raise ScenarioError(f("roce.cc"), "DCQCN reacts to CE marks: with ecn.marking "
                            "off the lossless class is never marked and DCQCN never cuts")
    if pp["pfc"]["enabled"]:
        check_pfc(topo_desc, pp, f)


def check_pfc(topo_desc: dict[str, Any], pp: dict[str, Any],
              f: Callable[[str], str]) -> None:
    """PFC's thresholds against every switch port's lossless queue: XOFF below the queue,
    XON below XOFF, and room above XOFF for what the port's feeders send while the pause
    takes effect (``controllers.pfc.headroom_bytes``, summed over the feeders: the pause is
    triggered on the egress queue, which all of them fill)."""
    p = pp["pfc"]
    if p["priority"] != LOSSLESS_PRIORITY:
        raise ScenarioError(f("pfc.priority"), f"priority {p['priority']} carries no traffic "
                            f"class: the lossless class (RoCE) is priority "
                            f"{LOSSLESS_PRIORITY}, and pausing another would hold nothing")
    limit = pp["classes"]["lossless_bytes"]
    reaction = REACTION_POLLS * p["poll_us"] / 1e6
    for port in watched_ports(topo_desc):
        wp = pfc.WatchedPort(ns="-", dev=port["dev"], xoff_bytes=p["xoff_bytes"],
                             xon_bytes=p["xon_bytes"], feeders=tuple(
                                 pfc.Feeder(ns="-", dev=f["dev"], rate_bps=1, ceil_bps=int(
                                     f["bw_mbps"] * 1e6)) for f in port["feeders"]))
        try:
            pfc.check_port(wp, limit, reaction, max((f["delay_ms"] for f in port["feeders"]),
                                                    default=0.0) / 1000)
        except ValueError as exc:
            field, _, why = str(exc).partition(": ")
            key = field.rsplit(".", 1)[-1]
            name = {"xoff_bytes": "pfc.xoff_bytes", "xon_bytes": "pfc.xon_bytes"}.get(
                key, "classes.lossless_bytes")
            raise ScenarioError(f(name), f"{port['dev']}: {why}") from None
    # the whole configuration as pfcd will get it, a host's namespace by its name: what
    # pfcd's fixed tables hold (namespaces, ports, feeders) is refused here, not at start
    switches = {s["name"] for s in topo_desc["switches"]}
    try:
        pfc.PfcConfig.from_dict(pfc_config(topo_desc, pp,
                                           lambda n: "-" if n in switches else n))
    except ValueError as exc:
        raise ScenarioError(f("pfc.enabled"), f"pfcd cannot take this fabric: {exc}") from None


def pfc_config(topo_desc: dict[str, Any], pp: dict[str, Any],
               ns_of: Callable[[str], str]) -> dict[str, Any]:
    """pfcd's configuration (``controllers.pfc``'s JSON form): every switch port watched
    with the phase's XOFF and XON, each of its feeders paused at ``pfc.pause_pct`` of its
    link; ``ns_of`` names a node's network namespace as pfcd opens it."""
    p, w = pp["pfc"], pp["classes"]["weight"]
    ports = []
    for port in watched_ports(topo_desc):
        feeders = [{"ns": ns_of(f["node"]), "dev": f["dev"],
                    "rate_bps": int(w * f["bw_mbps"] * 1e6),
                    "ceil_bps": int(f["bw_mbps"] * 1e6),
                    "pause_bps": int(f["bw_mbps"] * 1e6 * p["pause_pct"] / 100)}
                   for f in port["feeders"]]
        ports.append({"ns": ns_of(port["node"]), "dev": port["dev"],
                      "prio": p["priority"], "xoff_bytes": p["xoff_bytes"],
                      "xon_bytes": p["xon_bytes"], "feeders": feeders})
    slowest = min(ln["bw_mbps"] for ln in topo_desc["links"])
    return {"poll_us": p["poll_us"], "ports": ports,
            "pause_bps": int(slowest * 1e6 * p["pause_pct"] / 100)}


#: A switch's tier in the fabric, hosts below every switch: traffic goes up, then down.
TIERS = {"leaf": 1, "edge": 1, "agg": 2, "spine": 2, "core": 3}


def watched_ports(topo_desc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every switch egress port with its feeders: the far ends of the switch's links whose
    egress can bring traffic to this port (a host's NIC, or a neighbour switch's port).
    Each as {dev, node, peer, bw_mbps, feeders: [{node, dev, bw_mbps, delay_ms}]}.

    Why not every other link: the fabrics' routing is up-down (valley-free), so what comes
    down from a higher tier never leaves by a port that goes up again. A port towards a
    higher tier is fed by its switch's lower-tier links only. Pausing a downlink for an
    uplink's queue would hold traffic that never enters it, and it closes a loop of pauses
    (leaf2 up to spine1, spine1 down to leaf1, leaf1 up to spine2, spine2 down to leaf2):
    such a loop held a fabric paused for seconds, and a port that a paused class leaks into
    dropped in the lossless class."""
    switches = {s["name"]: TIERS.get(s.get("role", ""), 1) for s in topo_desc["switches"]}
    ends: dict[str, list[dict[str, Any]]] = {s: [] for s in switches}
    for ln in topo_desc["links"]:
        for node, port, peer, pport in ((ln["a"], ln["a_port"], ln["b"], ln["b_port"]),
                                        (ln["b"], ln["b_port"], ln["a"], ln["a_port"])):
            if node in switches:
                ends[node].append({"dev": f"{node}-eth{port}", "node": node, "peer": peer,
                                   "peer_dev": f"{peer}-eth{pport}",
                                   "up": switches.get(peer, 0) > switches[node],
                                   "bw_mbps": ln["bw_mbps"],
                                   "delay_ms": ln.get("delay_ms", 0.0)})
    out = []
    for sw in sorted(switches):
        for e in sorted(ends[sw], key=lambda x: x["dev"]):
            feeders = [{"node": o["peer"], "dev": o["peer_dev"], "bw_mbps": o["bw_mbps"],
                        "delay_ms": o["delay_ms"]}
                       for o in ends[sw] if o["dev"] != e["dev"]
                       and not (e["up"] and o["up"])]
            out.append({"dev": e["dev"], "node": sw, "peer": e["peer"],
                        "bw_mbps": e["bw_mbps"], "feeders": feeders})
    return out
