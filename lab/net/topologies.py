"""Leaf-spine and fat-tree fabrics as Mininet ``Topo``s with stable names and port numbers,
and the registry of every topology a scenario can name (``TOPOLOGIES``, the streaming edge of
``lab.net.edge`` among them).

Names and port numbers are part of the lab's interface: scenarios, tests and lessons refer to
``leaf1``, ``spine2``, ``h3`` and to "the uplink leaf1->spine2", so they must not depend on
build order. Ports are assigned explicitly (OVS uses them as OpenFlow port numbers), datapath
ids are explicit and distinct per tier, and every link carries its rate and queue limit.
"""

from __future__ import annotations

import inspect

from lab.model.checks import check_int
from lab.model.errors import TopologyError
from lab.net.edge import StreamingEdge
from lab.net.topobase import (
    DEFAULT_FABRIC_MBPS,
    DEFAULT_HOST_MBPS,
    DEFAULT_QUEUE_BYTES,
    FabricTopo,
    check_fabric_netem,
    check_links,
    check_mgmt_bw,
    check_size,
    size_guard,
)


class LeafSpine(FabricTopo):
    """Two-tier Clos: every leaf connects to every spine.

    Ports: on a leaf, hosts use 1..hosts_per_leaf and uplinks follow (spine i on port
    hosts_per_leaf+i); on a spine, leaf j is on port j. Hosts are numbered leaf by leaf.
    """

    kind = "leafspine"

    def build(self, spines: int = 2, leaves: int = 2, hosts_per_leaf: int = 4,
              host_bw: float = DEFAULT_HOST_MBPS, fabric_bw: float = DEFAULT_FABRIC_MBPS,
              queue_bytes: int = DEFAULT_QUEUE_BYTES, link_delay_ms: float = 0.0,
              link_jitter_ms: float = 0.0, link_loss_pct: float = 0.0,
              mgmt_bw: float = 0.0) -> None:
        spines = check_int("topology.spines", spines, 1, 64)
        leaves = check_int("topology.leaves", leaves, 1, 64)
        hosts_per_leaf = check_int("topology.hosts_per_leaf", hosts_per_leaf, 1, 64)
        mgmt_bw = check_mgmt_bw(mgmt_bw)
        check_size("topology.hosts_per_leaf", f"{leaves} leaves x {hosts_per_leaf} hosts",
                   spines + leaves + bool(mgmt_bw), leaves * hosts_per_leaf)
        host_bw, fabric_bw, queue_bytes = check_links(host_bw, fabric_bw, queue_bytes)
        netem = check_fabric_netem(link_delay_ms, link_jitter_ms, link_loss_pct)
        self.params = {"spines": spines, "leaves": leaves, "hosts_per_leaf": hosts_per_leaf,
                       "host_bw": host_bw, "fabric_bw": fabric_bw, "queue_bytes": queue_bytes,
                       **{f"link_{key}": v for key, v in netem.as_dict().items()},
                       **({"mgmt_bw": mgmt_bw} if mgmt_bw else {})}
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
        self.add_mgmt_network(mgmt_bw, queue_bytes)


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
              link_jitter_ms: float = 0.0, link_loss_pct: float = 0.0,
              mgmt_bw: float = 0.0) -> None:
        k = check_int("topology.k", k, 2, 16)
        if k % 2:
            raise TopologyError("topology.k", f"a fat-tree needs an even k, got {k}")
        mgmt_bw = check_mgmt_bw(mgmt_bw)
        check_size("topology.k", f"k={k}", 5 * k * k // 4 + bool(mgmt_bw), k ** 3 // 4)
        host_bw, fabric_bw, queue_bytes = check_links(host_bw, fabric_bw, queue_bytes)
        netem = check_fabric_netem(link_delay_ms, link_jitter_ms, link_loss_pct)
        self.params = {"k": k, "host_bw": host_bw, "fabric_bw": fabric_bw,
                       "queue_bytes": queue_bytes,
                       **{f"link_{key}": v for key, v in netem.as_dict().items()},
                       **({"mgmt_bw": mgmt_bw} if mgmt_bw else {})}
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
        self.add_mgmt_network(mgmt_bw, queue_bytes)

    def describe_switch(self, name: str) -> dict[str, object]:
        return {"pod": self.pods.get(name)}


#: Every topology a scenario's ``topology.type`` can name.
TOPOLOGIES: dict[str, type[FabricTopo]] = {
    cls.kind: cls for cls in (LeafSpine, FatTree, StreamingEdge)}


def make_topology(spec: dict[str, object], machine_limits: bool = True) -> FabricTopo:
    """Build a topology from a scenario's ``topology:`` mapping (``type`` plus parameters).

    ``machine_limits=False`` describes a fabric too large for one machine, for planning its
    split over several; it is never brought up.
    """
    spec = dict(spec)
    kind = spec.pop("type", "leafspine")
    cls = TOPOLOGIES.get(str(kind))
    if cls is None:
        raise TopologyError("topology.type", f"unknown topology {kind!r} "
                            f"(known: {', '.join(sorted(TOPOLOGIES))})")
    allowed = set(inspect.signature(cls.build).parameters) - {"self"}
    unknown = sorted(set(spec) - allowed, key=str)      # YAML keys need not be strings
    if unknown:
        raise TopologyError(f"topology.{unknown[0]}", f"unknown parameter for {kind} "
                            f"(known: {', '.join(sorted(allowed))})")
    with size_guard(machine_limits):
        return cls(**spec)


def build_defaults(spec: dict[str, object]) -> dict[str, object]:
    """The values a topology uses for the parameters ``spec`` leaves out (none for an
    unknown type: building it says what is wrong)."""
    cls = TOPOLOGIES.get(str(spec.get("type", "leafspine")))
    if cls is None:
        return {}
    return {name: p.default for name, p in inspect.signature(cls.build).parameters.items()
            if name != "self" and p.default is not inspect.Parameter.empty}


def describe(topo: FabricTopo) -> dict[str, object]:
    """The ``topology`` section of result.json: nodes, links with ports and rates."""
    switches = []
    for name in topo.switches():
        if not topo.on_fabric(name):        # the management LAN: its own section
            continue
        info = topo.nodeInfo(name)
        entry: dict[str, object] = {"name": name, "role": topo.role(name),
                                    "dpid": int(str(info["dpid"]), 16)}
        entry.update(topo.describe_switch(name))
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
    desc.update(topo.describe_extras())
    desc.update(topo.describe_mgmt())
    return desc
