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
from dataclasses import dataclass, field
from typing import Any

from controllers.marking import Marking
from lab.model import lossless
from lab.model.errors import ScenarioError
from lab.model.flows import BASE_DPORT, FIXED_SPORTS, ROCE_UDP_PORT, FlowSpec
from lab.model.scenario import Param, field_namer, phases_over, with_defaults
from lab.model.topodesc import check_fabric

#: What a flow group runs: RoCE QPs (the lossless class), or TCP (iperf3, cubic) in the
#: lossy class beside them - PFC pauses one priority, and the other keeps flowing.
TRANSPORTS = ("roce", "tcp")

SCHEMA: dict[str, Param] = {
    **lossless.SCHEMA,
    # [{group, from: [hosts], to: host, start_s, transport}]: one QP (or, transport tcp, one
    # iperf3 TCP flow) from each sender to the receiver
    "flows": Param(list),
    # the phase without the trouble (the victim alone): each group's goodput is judged
    # against its goodput there
    "baseline": Param(str),
    "ecn.marking": Param(str, choices=("off", "red")),
    "ecn.kmin_bytes": Param(int, -(1 << 31), 1 << 31),
    "ecn.kmax_bytes": Param(int, -(1 << 31), 1 << 31),
    "ecn.pmax": Param(float, -1, 2),
}

DEFAULTS: dict[str, dict[str, Any]] = {
    **lossless.DEFAULTS,
    "ecn": {"marking": "off", "kmin_bytes": 5_000, "kmax_bytes": 20_000, "pmax": 0.2},
}


@dataclass
class RoceFlow:
    """One QP of a phase: its 5-tuple (UDP, a fixed source port, 4791), when it starts.
    A sprayed QP (``spray`` > 1) sends from ``flow.sport`` and the next ``spray - 1``
    ports: ``subflows`` are those 5-tuples, watched on the switches like flows, so each
    one's path and bytes are what its packets did."""

    phase: str
    group: str
    start_s: float
    flow: FlowSpec
    transport: str = "roce"
    spray: int = 1
    subflows: list[FlowSpec] = field(default_factory=list)

    def spec(self) -> FlowSpec:
        return self.flow

    def specs(self) -> list[FlowSpec]:
        """Every 5-tuple the QP's packets carry: its own, then its subflows'."""
        return [self.flow, *self.subflows]


def phase_params(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{phase name: its full parameters}, in the scenario's order (one phase if none)."""
    return phases_over(with_defaults(params, DEFAULTS), params)


def flows(topo_desc: dict[str, Any], params: dict[str, Any],
          rng: random.Random) -> list[RoceFlow]:
    """Every phase's QPs, checked; source ports drawn from the seed, distinct across the run."""
    check_fabric(topo_desc, "roce")
    lossless.check_netem(topo_desc, "the roce kind")
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
            load = _load(item, w)
            for src in senders:
                planned.append(RoceFlow(name, group, start, FlowSpec(
                    id=f"{group}-{src}", src=src, dst=receiver, src_ip=ips[src],
                    dst_ip=ips[receiver], proto="tcp" if tcp else "udp", sport=0,
                    dport=0 if tcp else ROCE_UDP_PORT, rate_bps=load * host_bw[src] * 1e6,
                    kind=group, cc="cubic" if tcp else pp["roce"]["cc"]),
                    "tcp" if tcp else "roce", 1 if tcp else pp["roce"]["spray"]))
    if not planned:
        raise ScenarioError("flows", "no phase has a flow")
    base = params.get("baseline")
    if base is not None and base not in phases:
        raise ScenarioError("baseline", f"no phase {base!r} (phases: {', '.join(phases)})")
    for f, sport in zip(planned, rng.sample(FIXED_SPORTS, len(planned)), strict=True):
        f.flow.sport = sport
    _spray_ports([f for f in planned if f.spray > 1], {f.flow.sport for f in planned}, rng)
    for i, f in enumerate(x for x in planned if x.transport == "tcp"):
        f.flow.dport = BASE_DPORT + i      # each iperf3 server its own port
    return planned


def _spray_ports(sprayed: list[RoceFlow], used: set[int], rng: random.Random) -> None:
    """Each sprayed QP a block of source ports that no other flow's port is in (drawn from
    the seed), and its subflows: the block's next ``spray - 1`` ports."""
    for f, base in zip(sprayed, lossless.spray_blocks(len(sprayed), used, rng), strict=True):
        f.flow.sport = base
        f.subflows = lossless.spray_subflows(f.flow, f.spray)


#: A ``flows`` entry's keys: each sender's one QP (one RoCE endpoint per host: UDP 4791)
#: at ``load`` times its link rate (default 1; a share, so a rate-scaled profile keeps it).
GROUP_KEYS = ("group", "from", "to", "start_s", "transport", "load")


def _load(item: dict[str, Any], w: str) -> float:
    r = item.get("load", 1.0)
    if isinstance(r, bool) or not isinstance(r, int | float) or not 0 < r <= 1:
        raise ScenarioError(f"{w}.load", f"expected a share of the sender's link rate, "
                            f"more than 0 and at most 1, got {r!r}")
    return float(r)


def _flow_group(item: Any, w: str, ips: dict[str, str],
                pp: dict[str, Any]) -> tuple[str, list[str], str, float]:
    """One ``flows`` entry, checked: its group, senders, receiver and start time."""
    if not isinstance(item, dict):
        raise ScenarioError(w, "expected {group, from: [hosts], to: host, start_s, "
                            "transport}")
    unknown = set(item) - set(GROUP_KEYS)
    if unknown:
        raise ScenarioError(f"{w}.{sorted(unknown)[0]}", "unknown key (known: "
                            f"{', '.join(GROUP_KEYS)})")
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
    roce, ecn = pp["roce"], pp["ecn"]
    lossless.check(topo_desc, pp, f, (roce["size_bytes"] * roce["tx_depth"],
                                      "roce.size_bytes x roce.tx_depth"),
                   ecn["marking"] != "off")
    if ecn["marking"] == "red":
        try:
            Marking(ecn["kmin_bytes"], ecn["kmax_bytes"], ecn["pmax"])
        except ValueError as exc:
            field, _, why = str(exc).partition(": ")
            raise ScenarioError(f(f"ecn.{field.rsplit('.', 1)[-1]}"), why) from None
