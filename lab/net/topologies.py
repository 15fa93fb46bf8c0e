"""Leaf-spine and fat-tree fabrics as Mininet ``Topo``s with stable names and port numbers.

Names and port numbers are part of the lab's interface: scenarios, tests and lessons refer to
``leaf1``, ``spine2``, ``h3`` and to "the uplink leaf1->spine2", so they must not depend on
build order. Ports are assigned explicitly (OVS uses them as OpenFlow port numbers), datapath
ids are explicit and distinct per tier, and every link carries its rate and queue limit.
"""

from __future__ import annotations

import inspect
from contextvars import ContextVar
from dataclasses import dataclass

from mininet.topo import Topo

from lab.model.checks import check_int
from lab.model.errors import MachineError, TopologyError
from lab.net.links import Netem, check_netem

DEFAULT_FABRIC_MBPS = 100.0
DEFAULT_HOST_MBPS = 50.0
DEFAULT_QUEUE_BYTES = 150_000
#: htb with a 64 KiB burst stays accurate up to here; beyond it the datapath, not the
#: configured link, would be the bottleneck (the userspace datapath here carries ~8 Gbit/s:
#: shape far below it).
MAX_LINK_MBPS = 1000.0
#: The largest fabric the lab will try to bring up on one machine. Every switch is a bridge
#: of one userspace ovs-vswitchd and every host a namespace with its own traffic, all on the
#: same cores. Measured on the 2-core CI machine (README, "Scale beyond one machine"): a
#: fat-tree k=4 runs with valid fidelity, k=6 and k=8 come up (12 s, 35 s) but their runs
#: are CPU-bound and flagged invalid; beyond this limit bring-up alone takes minutes. A
#: bigger machine moves the fidelity line, not this guard. Planning a split over several
#: machines (``fabriclab topo --workers``) is not bound by it.
MAX_SWITCHES = 128
MAX_HOSTS = 256
_machine_limits: ContextVar[bool] = ContextVar("machine_limits", default=True)

_DPID_BASE = {"spine": 0x100, "core": 0x100, "leaf": 0x200, "agg": 0x200, "edge": 0x300}


@dataclass(frozen=True)
class HostAddr:
    ip: str
    mac: str


def host_addr(n: int) -> HostAddr:
    """Address of host ``h<n>``: 10.0.0.n/8 style, unique for n < 2**16."""
    return HostAddr(ip=f"10.0.{n >> 8}.{n & 0xFF}", mac=f"00:00:00:00:{n >> 8:02x}:{n & 0xFF:02x}")


def _check_rate(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TopologyError(field, f"expected a rate in Mbit/s, got {value!r}")
    if not 0 < value <= MAX_LINK_MBPS:
        raise TopologyError(field, f"{value} Mbit/s is a rate the link model cannot do "
                            f"faithfully (0 < rate <= {MAX_LINK_MBPS:g} Mbit/s)")
    return float(value)


def check_size(field: str, what: str, switches: int, hosts: int) -> None:
    """Refuse, naming ``field``, a fabric larger than MAX_SWITCHES or MAX_HOSTS."""
    if _machine_limits.get() and (switches > MAX_SWITCHES or hosts > MAX_HOSTS):
        raise TopologyError(field, f"{what} gives {switches} switches and {hosts} hosts, more "
                            f"than one machine emulates faithfully (at most {MAX_SWITCHES} "
                            f"switches and {MAX_HOSTS} hosts)")


def _check_links(host_bw: object, fabric_bw: object,
                 queue_bytes: object) -> tuple[float, float, int]:
    """The link parameters every fabric shares, checked."""
    return (_check_rate("topology.host_bw", host_bw),
            _check_rate("topology.fabric_bw", fabric_bw),
            check_int("topology.queue_bytes", queue_bytes, 3000, 64_000_000))


#: The fabric's own link parameters (switch to switch), as a scenario names them.
NETEM_FIELDS = ("topology.link_delay_ms", "topology.link_jitter_ms", "topology.link_loss_pct")


def _check_fabric_netem(delay_ms: object, jitter_ms: object, loss_pct: object) -> Netem:
    """Propagation delay (one way, per link), jitter and loss of every switch-to-switch link.

    Host links keep none: the hosts' NIC queues are rebuilt by the collective kind's storage
    classes, and a rack's own RTT stays the emulator's. A path leaf -> spine -> leaf gets
    2 x delay each way, an inter-pod fat-tree path 4 x.
    """
    return check_netem(NETEM_FIELDS, delay_ms, jitter_ms, loss_pct)


def refuse_without_netem(topo_desc: dict[str, object], netem: bool) -> None:
    """Before anything starts: a fabric asking for delay, jitter or loss on a kernel without
    netem is refused, naming the first value asked for (the links would refuse it too, but
    only once the fabric is half up)."""
    params = topo_desc.get("params")
    if netem or not isinstance(params, dict):
        return
    for field in NETEM_FIELDS:
        key = field.removeprefix("topology.")
        if params.get(key):
            raise MachineError(field, f"{params[key]:g} asked for, but this kernel has no "
                               "netem: delay, jitter and loss cannot be emulated here (see "
                               "`fabriclab doctor`)")


class FabricTopo(Topo):
    """Common bookkeeping: tiers, host addresses, link rates, oversubscription."""

    kind = "fabric"

    def __init__(self, **params: object) -> None:
        self.roles: dict[str, str] = {}
        self.params: dict[str, object] = {}
        self.oversubscription = 1.0
        super().__init__(**params)

    def add_fabric_switch(self, role: str, index: int) -> str:
        name = f"{role}{index}"
        self.addSwitch(name, dpid=f"{_DPID_BASE[role] + index:016x}", protocols="OpenFlow13")
        self.roles[name] = role
        return name

    def add_fabric_host(self, index: int) -> str:
        name = f"h{index}"
        addr = host_addr(index)
        self.addHost(name, ip=f"{addr.ip}/8", mac=addr.mac)
        self.roles[name] = "host"
        return name

    def shaped(self, bw: float, queue_bytes: int,
               netem: Netem | None = None) -> dict[str, object]:
        """A link's parameters for ``addLink``: rate, byte queue and, if any, netem's."""
        params: dict[str, object] = {"bw": bw, "queue_bytes": queue_bytes}
        if netem is not None and netem.active:
            # A kernel without netem refuses the link naming the first value asked for.
            asked = [f for f, v in zip(NETEM_FIELDS, netem.as_dict().values(), strict=True) if v]
            params.update(netem.as_dict(), netem_field=asked[0])
        return params

    def role(self, name: str) -> str:
        return self.roles[name]

    def on_fabric(self, name: str) -> bool:
        """Switches, hosts and gateways: what the controller programs and forwards for.

        Routers and hosts behind them (``lab.net.edge``) are outside the fabric."""
        return self.roles.get(name) in {"host", "media", "origin", "gateway",
                                        *_DPID_BASE}


class LeafSpine(FabricTopo):
    """Two-tier Clos: every leaf connects to every spine.

    Ports: on a leaf, hosts use 1..hosts_per_leaf and uplinks follow (spine i on port
    hosts_per_leaf+i); on a spine, leaf j is on port j. Hosts are numbered leaf by leaf.
    """

    kind = "leafspine"

    def build(self, spines: int = 2, leaves: int = 2, hosts_per_leaf: int = 4,
              host_bw: float = DEFAULT_HOST_MBPS, fabric_bw: float = DEFAULT_FABRIC_MBPS,
              queue_bytes: int = DEFAULT_QUEUE_BYTES, link_delay_ms: float = 0.0,
              link_jitter_ms: float = 0.0, link_loss_pct: float = 0.0) -> None:
        spines = check_int("topology.spines", spines, 1, 64)
        leaves = check_int("topology.leaves", leaves, 1, 64)
        hosts_per_leaf = check_int("topology.hosts_per_leaf", hosts_per_leaf, 1, 64)
        check_size("topology.hosts_per_leaf", f"{leaves} leaves x {hosts_per_leaf} hosts",
                   spines + leaves, leaves * hosts_per_leaf)
        host_bw, fabric_bw, queue_bytes = _check_links(host_bw, fabric_bw, queue_bytes)
        netem = _check_fabric_netem(link_delay_ms, link_jitter_ms, link_loss_pct)
        self.params = {"spines": spines, "leaves": leaves, "hosts_per_leaf": hosts_per_leaf,
                       "host_bw": host_bw, "fabric_bw": fabric_bw, "queue_bytes": queue_bytes,
                       **{f"link_{key}": v for key, v in netem.as_dict().items()}}
        self.oversubscription = hosts_per_leaf * host_bw / (spines * fabric_bw)

        spine_names = [self.add_fabric_switch("spine", i) for i in range(1, spines + 1)]
        for j in range(1, leaves + 1):
            leaf = self.add_fabric_switch("leaf", j)
            for k in range(1, hosts_per_leaf + 1):
                host = self.add_fabric_host((j - 1) * hosts_per_leaf + k)
                self.addLink(host, leaf, port1=0, port2=k, **self.shaped(host_bw, queue_bytes))
            for i, spine in enumerate(spine_names, start=1):
                self.addLink(leaf, spine, port1=hosts_per_leaf + i, port2=j,
                             **self.shaped(fabric_bw, queue_bytes, netem))


class FatTree(FabricTopo):
    """The k-ary fat-tree of Al-Fares et al.: k pods, (k/2)^2 cores, k^3/4 hosts.

    Names are numbered globally (``edge1``..``edge{k*k/2}``, ``agg1``.., ``core1``..); the pod
    of each switch is in ``pods``. Ports: an edge switch has hosts on 1..k/2 and aggs on
    k/2+1..k; an agg has edges on 1..k/2 and cores on k/2+1..k; core c has pod p on port p.
    """

    kind = "fattree"

    def build(self, k: int = 4, host_bw: float = DEFAULT_FABRIC_MBPS,
              fabric_bw: float = DEFAULT_FABRIC_MBPS,
              queue_bytes: int = DEFAULT_QUEUE_BYTES, link_delay_ms: float = 0.0,
              link_jitter_ms: float = 0.0, link_loss_pct: float = 0.0) -> None:
        k = check_int("topology.k", k, 2, 16)
        if k % 2:
            raise TopologyError("topology.k", f"a fat-tree needs an even k, got {k}")
        check_size("topology.k", f"k={k}", 5 * k * k // 4, k ** 3 // 4)
        host_bw, fabric_bw, queue_bytes = _check_links(host_bw, fabric_bw, queue_bytes)
        netem = _check_fabric_netem(link_delay_ms, link_jitter_ms, link_loss_pct)
        self.params = {"k": k, "host_bw": host_bw, "fabric_bw": fabric_bw,
                       "queue_bytes": queue_bytes,
                       **{f"link_{key}": v for key, v in netem.as_dict().items()}}
        half = k // 2
        self.oversubscription = half * host_bw / (half * fabric_bw)
        self.pods: dict[str, int] = {}
        cores = [self.add_fabric_switch("core", c) for c in range(1, half * half + 1)]
        host_index = 1
        for pod in range(1, k + 1):
            aggs = [self.add_fabric_switch("agg", (pod - 1) * half + a) for a in range(1, half + 1)]
            edges = [self.add_fabric_switch("edge", (pod - 1) * half + e)
                     for e in range(1, half + 1)]
            for sw in aggs + edges:
                self.pods[sw] = pod
            for e, edge in enumerate(edges, start=1):
                for h in range(1, half + 1):
                    host = self.add_fabric_host(host_index)
                    host_index += 1
                    self.addLink(host, edge, port1=0, port2=h,
                                 **self.shaped(host_bw, queue_bytes))
                for a, agg in enumerate(aggs, start=1):
                    self.addLink(edge, agg, port1=half + a, port2=e,
                                 **self.shaped(fabric_bw, queue_bytes, netem))
            for a, agg in enumerate(aggs, start=1):
                # Agg a of every pod reaches cores (a-1)*half+1 .. a*half.
                for c in range(1, half + 1):
                    core = cores[(a - 1) * half + c - 1]
                    self.addLink(agg, core, port1=half + c, port2=pod,
                                 **self.shaped(fabric_bw, queue_bytes, netem))


TOPOLOGIES: dict[str, type[FabricTopo]] = {"leafspine": LeafSpine, "fattree": FatTree}


def topology_class(kind: str) -> type[FabricTopo] | None:
    if kind == "streaming-edge":
        from lab.net.edge import StreamingEdge  # imports FRR's Mininet glue: only when asked
        return StreamingEdge
    return TOPOLOGIES.get(kind)


def make_topology(spec: dict[str, object], machine_limits: bool = True) -> FabricTopo:
    """Build a topology from a scenario's ``topology:`` mapping (``type`` plus parameters).

    ``machine_limits=False`` describes a fabric too large for one machine, for planning its
    split over several; it is never brought up.
    """
    spec = dict(spec)
    kind = spec.pop("type", "leafspine")
    cls = topology_class(str(kind))
    if cls is None:
        raise TopologyError("topology.type", f"unknown topology {kind!r} "
                            f"(known: {', '.join(sorted([*TOPOLOGIES, 'streaming-edge']))})")
    allowed = set(inspect.signature(cls.build).parameters) - {"self"}
    unknown = sorted(set(spec) - allowed, key=str)      # YAML keys need not be strings
    if unknown:
        raise TopologyError(f"topology.{unknown[0]}", f"unknown parameter for {kind} "
                            f"(known: {', '.join(sorted(allowed))})")
    token = _machine_limits.set(machine_limits)
    try:
        return cls(**spec)
    finally:
        _machine_limits.reset(token)


def build_defaults(spec: dict[str, object]) -> dict[str, object]:
    """The values a topology uses for the parameters ``spec`` leaves out (none for an
    unknown type: building it says what is wrong)."""
    cls = topology_class(str(spec.get("type", "leafspine")))
    if cls is None:
        return {}
    return {name: p.default for name, p in inspect.signature(cls.build).parameters.items()
            if name != "self" and p.default is not inspect.Parameter.empty}


def describe(topo: FabricTopo) -> dict[str, object]:
    """The ``topology`` section of result.json: nodes, links with ports and rates."""
    switches = []
    for name in topo.switches():
        info = topo.nodeInfo(name)
        entry: dict[str, object] = {"name": name, "role": topo.role(name),
                                    "dpid": int(str(info["dpid"]), 16)}
        if isinstance(topo, FatTree):
            entry["pod"] = topo.pods.get(name)
        switches.append(entry)
    hosts = []
    for name in topo.hosts():
        if not topo.on_fabric(name):
            continue
        info = topo.nodeInfo(name)
        entry = {"name": name, "ip": str(info["ip"]).split("/")[0], "mac": info["mac"]}
        if topo.role(name) != "host":
            entry["role"] = topo.role(name)
        hosts.append(entry)
    links = []
    for a, b, info in topo.links(sort=False, withInfo=True):
        if not (topo.on_fabric(a) and topo.on_fabric(b)):
            continue
        # Topo.links() yields (node1, node2) in the order given to addLink, ports alike.
        links.append({"a": a, "a_port": info["port1"], "b": b, "b_port": info["port2"],
                      "bw_mbps": info["bw"], "queue_bytes": info["queue_bytes"],
                      "delay_ms": info.get("delay_ms", 0.0)})
    desc: dict[str, object] = {"type": topo.kind, "params": dict(topo.params),
                               "oversubscription": round(topo.oversubscription, 4),
                               "switches": switches, "hosts": hosts, "links": links}
    if hasattr(topo, "bgp"):
        desc["routers"] = topo.routers_desc()
        desc["router_links"] = topo.router_links_desc()
        desc["external_hosts"] = topo.external_hosts()
    return desc
