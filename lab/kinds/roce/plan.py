"""The roce kind's scenario: RoCEv2 flows on a fabric with a lossless class, phase by phase.

Each flow is one RC queue pair of ``roce_bw`` (``lab/agents/roce``, perftest's
``ib_write_bw`` on the lab's own RoCEv2 transport) from a sender to a receiver; flows come in
named groups (an incast, a victim, flows joining one after another). Every port of the
fabric carries two traffic classes (``controllers.classes``): RoCE in the lossless one, the
rest in the lossy one. A phase chooses PFC on the lossless class or not (``pfc``), ECN
marking of it (``ecn``) and the senders' congestion control (``roce.cc``): PFC-only, ECN +
DCQCN, or a lossy fabric where go-back-N recovers every drop.

Everything a scenario can get wrong is refused here, naming the key, before anything
starts: hosts that do not exist, PFC thresholds the queue cannot hold or whose headroom is
below what the links' rate and delay need, DCQCN without marking, an MTU the links cannot
carry.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controllers import pfc
from controllers.classes import LOSSLESS_PRIORITY, TrafficClasses
from controllers.marking import Marking
from lab.model.errors import ScenarioError
from lab.model.flows import BASE_DPORT, FIXED_SPORTS, ROCE_UDP_PORT, FlowSpec
from lab.model.scenario import Param, field_namer, phases_over, with_defaults
from lab.model.topodesc import check_fabric

#: What a flow group runs: RoCE QPs (the lossless class), or TCP (iperf3, cubic) in the
#: lossy class beside them - PFC pauses one priority, and the other keeps flowing.
TRANSPORTS = ("roce", "tcp")
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

SCHEMA: dict[str, Param] = {
    # [{group, from: [hosts], to: host, start_s, transport}]: one QP (or, transport tcp, one
    # iperf3 TCP flow) from each sender to the receiver
    "flows": Param(list),
    # the phase without the trouble (the victim alone): each group's goodput is judged
    # against its goodput there
    "baseline": Param(str),
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
    "pfc.enabled": Param(bool),
    # the 802.1p priority PFC acts on: it must be the lossless class's
    "pfc.priority": Param(int, 0, 7),
    "pfc.xoff_bytes": Param(int, -(1 << 31), 1 << 31),
    "pfc.xon_bytes": Param(int, -(1 << 31), 1 << 31),
    "pfc.poll_us": Param(int, 100, 100_000),
    # what a paused class is held at, in % of its link (controllers/pfc/README.md: 5 % keeps
    # a port full with one frame leaked per pause)
    "pfc.pause_pct": Param(float, 0.5, 50),
    "ecn.marking": Param(str, choices=("off", "red")),
    "ecn.kmin_bytes": Param(int, -(1 << 31), 1 << 31),
    "ecn.kmax_bytes": Param(int, -(1 << 31), 1 << 31),
    "ecn.pmax": Param(float, -1, 2),
}

DEFAULTS: dict[str, dict[str, Any]] = {
    "classes": {"weight": 0.5, "lossless_bytes": 150_000, "lossy_bytes": 150_000,
                "host_bytes": 2_000_000},
    # perftest's defaults where it has them (64 KB messages, tx depth 16 is ours: 128 is
    # ib_write_bw's, 8 MB a QP, far beyond a 50 Mbit/s port's buffer)
    "roce": {"cc": "none", "mtu": 1024, "size_bytes": 65536, "tx_depth": 16,
             "rto_ms": 64.0},
    "pfc": {"enabled": False, "priority": LOSSLESS_PRIORITY, "xoff_bytes": 30_000,
            "xon_bytes": 15_000, "poll_us": 1000, "pause_pct": 5.0},
    "ecn": {"marking": "off", "kmin_bytes": 5_000, "kmax_bytes": 20_000, "pmax": 0.2},
}


@dataclass
class RoceFlow:
    """One QP of a phase: its 5-tuple (UDP, a fixed source port, 4791), when it starts."""

    phase: str
    group: str
    start_s: float
    flow: FlowSpec
    transport: str = "roce"

    def spec(self) -> FlowSpec:
        return self.flow


def phase_params(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{phase name: its full parameters}, in the scenario's order (one phase if none)."""
    return phases_over(with_defaults(params, DEFAULTS), params)


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


def flows(topo_desc: dict[str, Any], params: dict[str, Any],
          rng: random.Random) -> list[RoceFlow]:
    """Every phase's QPs, checked; source ports drawn from the seed, distinct across the run."""
    check_fabric(topo_desc, "roce")
    for key in ("link_delay_ms", "link_jitter_ms", "link_loss_pct"):
        if topo_desc["params"].get(key):
            raise ScenarioError(f"topology.{key}", "the roce kind's traffic classes are "
                                "built on links without netem so far")
    ips = {h["name"]: h["ip"] for h in topo_desc["hosts"]}
    host_bw = {ln["a"]: ln["bw_mbps"] for ln in topo_desc["links"] if ln["a"] in ips}
    phases = phase_params(params)
    planned: list[RoceFlow] = []
    raw = params.get("phases") or {}
    for name, pp in phases.items():
        f = field_namer(name, raw.get(name) or {})
        check_phase(topo_desc, pp, f)
        for i, item in enumerate(pp.get("flows") or []):
            w = f"{f('flows')}[{i}]"
            group, senders, receiver, start = _flow_group(item, w, ips, pp)
            tcp = item.get("transport", "roce") == "tcp"
            for src in senders:
                planned.append(RoceFlow(name, group, start, FlowSpec(
                    id=f"{group}-{src}", src=src, dst=receiver, src_ip=ips[src],
                    dst_ip=ips[receiver], proto="tcp" if tcp else "udp", sport=0,
                    dport=0 if tcp else ROCE_UDP_PORT, rate_bps=host_bw[src] * 1e6, kind=group,
                    cc="cubic" if tcp else pp["roce"]["cc"]), "tcp" if tcp else "roce"))
    if not planned:
        raise ScenarioError("flows", "no phase has a flow")
    base = params.get("baseline")
    if base is not None and base not in phases:
        raise ScenarioError("baseline", f"no phase {base!r} (phases: {', '.join(phases)})")
    for f, sport in zip(planned, rng.sample(FIXED_SPORTS, len(planned)), strict=True):
        f.flow.sport = sport
    for i, f in enumerate(x for x in planned if x.transport == "tcp"):
        f.flow.dport = BASE_DPORT + i      # each iperf3 server its own port
    return planned


def _flow_group(item: Any, w: str, ips: dict[str, str],
                pp: dict[str, Any]) -> tuple[str, list[str], str, float]:
    """One ``flows`` entry, checked: its group, senders, receiver and start time."""
    if not isinstance(item, dict):
        raise ScenarioError(w, "expected {group, from: [hosts], to: host, start_s, "
                            "transport}")
    unknown = set(item) - {"group", "from", "to", "start_s", "transport"}
    if unknown:
        raise ScenarioError(f"{w}.{sorted(unknown)[0]}", "unknown key (known: group, from, "
                            "to, start_s, transport)")
    transport = item.get("transport", "roce")
    if transport not in TRANSPORTS:
        raise ScenarioError(f"{w}.transport", f"{transport!r} is not one of "
                            f"{', '.join(TRANSPORTS)}")
    if transport == "tcp" and item.get("start_s", 0):
        raise ScenarioError(f"{w}.start_s", "TCP flows (iperf3) start with the phase")
    group = item.get("group")
    if not isinstance(group, str) or not group.isidentifier():
        raise ScenarioError(f"{w}.group", f"expected a name, got {group!r}")
    senders = item.get("from")
    if not isinstance(senders, list) or not senders:
        raise ScenarioError(f"{w}.from", "expected a non-empty list of hosts")
    receiver = item.get("to")
    for j, h in enumerate([*senders, receiver]):
        field = f"{w}.from[{j}]" if j < len(senders) else f"{w}.to"
        if h not in ips:
            raise ScenarioError(field, f"no host {h!r} in this topology")
    if receiver in senders:
        raise ScenarioError(f"{w}.to", f"{receiver} cannot send to itself")
    if len(set(senders)) != len(senders):
        raise ScenarioError(f"{w}.from", "a host is named twice")
    start = item.get("start_s", 0.0)
    if isinstance(start, bool) or not isinstance(start, int | float) or \
            not 0 <= start < float(pp.get("duration", 600)):
        raise ScenarioError(f"{w}.start_s", "expected seconds from 0 to before the "
                            f"phase's duration, got {start!r}")
    return group, senders, receiver, float(start)


def check_phase(topo_desc: dict[str, Any], pp: dict[str, Any],
                f: Callable[[str], str]) -> None:
    """What a phase's classes, PFC, marking and transport must satisfy on this topology
    (``f`` names a key as the user wrote it: ``lab.model.scenario.field_namer``)."""
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
    outstanding = roce["size_bytes"] * roce["tx_depth"]
    if outstanding > pp["classes"]["host_bytes"]:
        raise ScenarioError(f("classes.host_bytes"), f"{pp['classes']['host_bytes']} B "
                            f"is below what one QP may have outstanding (roce.size_bytes x "
                            f"roce.tx_depth = {outstanding} B): a host's NIC would drop")
    ecn = pp["ecn"]
    if roce["cc"] == "dcqcn" and ecn["marking"] == "off":
        raise ScenarioError(f("roce.cc"), "DCQCN reacts to CE marks: with ecn.marking "
                            "off the lossless class is never marked and DCQCN never cuts")
    if ecn["marking"] == "red":
        try:
            Marking(ecn["kmin_bytes"], ecn["kmax_bytes"], ecn["pmax"])
        except ValueError as exc:
            field, _, why = str(exc).partition(": ")
            raise ScenarioError(f(f"ecn.{field.rsplit('.', 1)[-1]}"), why) from None
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


def watched_ports(topo_desc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every switch egress port with its feeders: the far ends of the switch's other links,
    whose egress brings traffic into the switch (a host's NIC, or a neighbour switch's port).
    Each as {dev, node, peer, bw_mbps, feeders: [{node, dev, bw_mbps, delay_ms}]}."""
    switches = {s["name"] for s in topo_desc["switches"]}
    ends: dict[str, list[dict[str, Any]]] = {s: [] for s in switches}
    for ln in topo_desc["links"]:
        for node, port, peer, pport in ((ln["a"], ln["a_port"], ln["b"], ln["b_port"]),
                                        (ln["b"], ln["b_port"], ln["a"], ln["a_port"])):
            if node in switches:
                ends[node].append({"dev": f"{node}-eth{port}", "node": node, "peer": peer,
                                   "peer_dev": f"{peer}-eth{pport}",
                                   "bw_mbps": ln["bw_mbps"],
                                   "delay_ms": ln.get("delay_ms", 0.0)})
    out = []
    for sw in sorted(switches):
        for e in sorted(ends[sw], key=lambda x: x["dev"]):
            feeders = [{"node": o["peer"], "dev": o["peer_dev"], "bw_mbps": o["bw_mbps"],
                        "delay_ms": o["delay_ms"]}
                       for o in ends[sw] if o["dev"] != e["dev"]]
            out.append({"dev": e["dev"], "node": sw, "peer": e["peer"],
                        "bw_mbps": e["bw_mbps"], "feeders": feeders})
    return out
