"""The live-streaming data centre of the founding story, as one Mininet ``Topo``.

::

    anchorN, cdnN --- ispN (AS 65000+N) ===uplinks=== borderB (AS 65000) ===core links=== dccore
                                                                                          |
                      [ OVS leaf-spine, controller-programmed: leaf2 - spines - leaf1 ] --+
                                                                  |
                                         media servers h1..hS, origin h(S+1)

* The DC fabric is a leaf-spine of OVS switches (the lab's controller programs it); ``leaf1``
  holds the ingest media servers and the origin, ``leaf2`` the DC core router ``dccore``,
  which is the fabric's gateway to everything outside.
* ``dccore`` and the border routers share AS 65000 (iBGP over every core link, next-hop-self);
  every border has ``uplinks`` parallel eBGP links to every ISP. With ``bfd`` (the default)
  every session runs BFD, which a failover needs to notice a silent cut in time. Without a cut
  to notice it is only cost: a bfdd per router sending every 100 ms on every session took
  ~45 % of a core in a guest without hardware virtualisation.
* Each ISP has one CDN node and one anchor (a streamer pushing into the DC) behind it.
* The uplinks are WAN links: ``wan_delay_ms`` of one-way propagation delay (netem) in each
  direction, where the kernel has netem. Without netem they have none, and the streaming
  kind records that (``fidelity.wan_delay``): the incident itself is about rates and hashes,
  so it still shows, only with the DC's own RTTs.

The hash decisions of the incident are the kernel's: ``dccore`` spreads over the core links
to both borders, a border over its uplinks to the ISP. A packet from the origin reaches
``dccore`` through the OVS datapath, which carries no socket hash along (measured: over a
bare veth the sender's random hash would decide instead of the headers), so what the routers
hash is the packet's headers, as on a real wire.
"""

from __future__ import annotations

from ipaddress import IPv4Network
from typing import Any

from lab.model.checks import check_int
from lab.model.errors import TopologyError
from lab.net.bgp import Router
from lab.net.frr import BgpTopo, FrrRouter
from lab.net.links import ShapedLink, check_netem
from lab.net.topobase import FabricTopo, check_links, check_rate

DC_AS = 65000
DC_PREFIX = "10.0.0.0/8"
GATEWAY_IP = "10.0.0.254"
GATEWAY_MAC = "00:00:00:00:00:fe"
CORE = "dccore"
#: Point-to-point subnets between routers are carved from here, /30 each, in build order.
P2P_POOL = IPv4Network("172.16.0.0/16")
CDN_POOL = IPv4Network("203.0.113.0/24")
ANCHOR_POOL = IPv4Network("198.51.100.0/24")
MAX_PATHS = 16
#: One-way delay of an ISP uplink when the scenario does not say: a metro/regional hop
#: between a DC border and an ISP's network (a 20 ms RTT).
DEFAULT_WAN_DELAY_MS = 10.0


class StreamingEdge(FabricTopo, BgpTopo):
    """Leaf-spine DC fabric + DC core + border routers + ISPs with CDN nodes and anchors."""

    kind = "streaming-edge"

    def build(self, spines: int = 2, servers: int = 4, borders: int = 2, isps: int = 2,
              uplinks: int = 2, core_links: int = 2, host_bw: float = 50.0,
              fabric_bw: float = 100.0, core_bw: float = 100.0, uplink_bw: float = 20.0,
              access_bw: float = 100.0, queue_bytes: int = 150_000,
              wan_delay_ms: float = DEFAULT_WAN_DELAY_MS, bfd: bool = True) -> None:
        spines = check_int("topology.spines", spines, 1, 8)
        servers = check_int("topology.servers", servers, 1, 32)
        borders = check_int("topology.borders", borders, 1, 4)
        isps = check_int("topology.isps", isps, 1, 4)
        uplinks = check_int("topology.uplinks", uplinks, 1, 8)
        core_links = check_int("topology.core_links", core_links, 1, 8)
        host_bw, fabric_bw, queue_bytes = check_links(host_bw, fabric_bw, queue_bytes)
        core_bw = check_rate("topology.core_bw", core_bw)
        uplink_bw = check_rate("topology.uplink_bw", uplink_bw)
        access_bw = check_rate("topology.access_bw", access_bw)
        self.wan = check_netem(("topology.wan_delay_ms", "", ""), wan_delay_ms)
        if not isinstance(bfd, bool):
            raise TopologyError("topology.bfd", f"expected true or false, got {bfd!r}")
        self.bfd = bfd
        self.params = {"spines": spines, "servers": servers, "borders": borders, "isps": isps,
                       "uplinks": uplinks, "core_links": core_links, "host_bw": host_bw,
                       "fabric_bw": fabric_bw, "core_bw": core_bw, "uplink_bw": uplink_bw,
                       "access_bw": access_bw, "queue_bytes": queue_bytes,
                       "wan_delay_ms": self.wan.delay_ms, "bfd": bfd}
        self.queue_bytes = queue_bytes
        self._p2p = P2P_POOL.subnets(new_prefix=30)
        # Router links by role, in build order: what telemetry and the report name.
        self.link_roles: dict[tuple[str, int], str] = {}
        self.router_links: list[dict[str, Any]] = []

        # -- the DC fabric: leaf1 (servers + origin) and leaf2 (the gateway), all spines ----
        hosts_on_leaf1 = servers + 1
        spine_names = [self.add_fabric_switch("spine", i) for i in range(1, spines + 1)]
        leaf1, leaf2 = self.add_fabric_switch("leaf", 1), self.add_fabric_switch("leaf", 2)
        for k in range(1, hosts_on_leaf1 + 1):
            host = self.add_fabric_host(k)
            self.roles[host] = "origin" if k == hosts_on_leaf1 else "media"
            self.addLink(host, leaf1, port1=0, port2=k, **self.shaped(host_bw, queue_bytes))
        # dccore's fabric interface is its port 0, so Mininet's ip=/mac= land on it.
        core = self.bgp.add_router(CORE, DC_AS, networks=[DC_PREFIX], maximum_paths=MAX_PATHS,
                                   transit=True)
        self.bgp.add_external(CORE, leaf2, f"{GATEWAY_IP}/8")
        self.addHost(CORE, cls=FrrRouter, ip=f"{GATEWAY_IP}/8", mac=GATEWAY_MAC, plan=core)
        self.roles[CORE] = "gateway"
        self.addLink(CORE, leaf2, port1=0, port2=1, **self.shaped(fabric_bw, queue_bytes))
        for leaf, first_uplink in ((leaf1, hosts_on_leaf1 + 1), (leaf2, 2)):
            for i, spine in enumerate(spine_names, start=1):
                self.addLink(leaf, spine, port1=first_uplink + i - 1, port2=int(leaf[4:]),
                             **self.shaped(fabric_bw, queue_bytes))

        # -- routers: borders (iBGP with dccore), ISPs (eBGP with every border) ---------------
        for b in range(1, borders + 1):
            # A border announces the DC prefix it learns from dccore, and nothing else: an
            # edge with two ISPs must not carry one ISP's routes to the other.
            self._router(f"border{b}", DC_AS, transit=False, announce=[DC_PREFIX])
            for _ in range(core_links):
                self._router_link(CORE, f"border{b}", core_bw, "core")
        for i in range(1, isps + 1):
            cdn_net = list(CDN_POOL.subnets(new_prefix=26))[i - 1]
            anchor_net = list(ANCHOR_POOL.subnets(new_prefix=26))[i - 1]
            isp = f"isp{i}"
            self._router(isp, DC_AS + i, networks=[str(cdn_net), str(anchor_net)])
            for b in range(1, borders + 1):
                for _ in range(uplinks):
                    self._router_link(f"border{b}", isp, uplink_bw, "uplink")
            for host, net in ((f"cdn{i}", cdn_net), (f"anchor{i}", anchor_net)):
                self.addEndHost(host)
                self.roles[host] = "external"
                self.addBgpLink(isp, host, (f"{net[1]}/{net.prefixlen}",
                                            f"{net[10]}/{net.prefixlen}"),
                                bw=access_bw, queue_bytes=queue_bytes)
                self.link_roles[(isp, self.bgp.links[-1].a_port)] = "access"
                self.link_roles[(host, self.bgp.links[-1].b_port)] = "access"

    # -- helpers -----------------------------------------------------------------------------
    def _router(self, name: str, asn: int, **opts: Any) -> Router:
        r = self.bgp.add_router(name, asn, maximum_paths=MAX_PATHS, **opts)
        self.addHost(name, cls=FrrRouter, ip=None, plan=r)
        self.roles[name] = "router"
        return r

    def _router_link(self, a: str, b: str, bw: float, role: str) -> None:
        subnet = str(next(self._p2p))
        link = self.bgp.add_link(a, b, subnet, bgp=True, bfd=self.bfd, bw=bw)
        wan: dict[str, object] = {}
        if role == "uplink" and self.wan.active:
            # Applied where the kernel has netem, skipped where it has not: the kind reads
            # back what the uplinks got and records it.
            wan = {**self.wan.as_dict(), "netem_optional": True}
        self.addLink(a, b, port1=link.a_port, port2=link.b_port, cls=ShapedLink, bw=bw,
                     queue_bytes=self.queue_bytes, **wan)
        self.link_roles[(a, link.a_port)] = role
        self.link_roles[(b, link.b_port)] = role

    # -- what the report needs beyond the fabric ----------------------------------------------
    def describe_extras(self) -> dict[str, object]:
        """The routers, every link of the BGP plan and the hosts behind the routers."""
        return {"routers": self.routers_desc(), "router_links": self.router_links_desc(),
                "external_hosts": self.external_hosts()}

    def routers_desc(self) -> list[dict[str, Any]]:
        return [{"name": r.name, "asn": r.asn, "router_id": str(r.router_id),
                 "networks": [str(n) for n in r.networks],
                 "interfaces": {i.name: [str(a) for a in i.addresses] for i in r.interfaces}}
                for r in self.bgp.routers.values()]

    def router_links_desc(self) -> list[dict[str, Any]]:
        """Every link between two nodes of the BGP plan (routers and external hosts)."""
        return [{"a": ln.a, "a_port": ln.a_port, "b": ln.b, "b_port": ln.b_port,
                 "a_intf": ln.a_intf, "b_intf": ln.b_intf, "bw_mbps": ln.bw,
                 "queue_bytes": self.queue_bytes,
                 "role": self.link_roles.get((ln.a, ln.a_port), "access"),
                 "wan_delay_ms": self.wan.delay_ms
                 if self.link_roles.get((ln.a, ln.a_port)) == "uplink" else 0.0,
                 "subnet": str(ln.pairs[0][0].network)} for ln in self.bgp.links]

    def external_hosts(self) -> list[dict[str, Any]]:
        return [{"name": h.name, "ip": str(h.interfaces[0].addresses[0].ip),
                 "gateway": str(h.gateway)} for h in self.bgp.hosts.values()]
