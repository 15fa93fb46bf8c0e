"""A BGP edge as data: routers, hosts, links and sessions, and the FRR config text they imply.

Pure Python (no Mininet, no root), so every refusal and every generated line is unit-tested.
The lab writes the configs; nobody hand-edits them. That makes two things checkable before
anything starts: a session can only be configured towards an address that really sits at
the far end of one of the router's links, and every number FRR or the kernel would reject
(an AS out of range, ``maximum-paths 0``) is refused here with the field that is wrong.

Defaults are chosen for an emulated fabric that must converge in seconds, not for the
Internet: keepalive 1 s / hold 3 s, connect-retry 1 s, no advertisement interval,
``no bgp ebgp-requires-policy`` (FRR 8 otherwise sends and accepts nothing on eBGP without a
policy), and BFD at 100 ms x 3 where a session asks for it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Interface, IPv4Network

from lab.model.checks import check_int
from lab.model.errors import TopologyError

ASN_MIN, ASN_MAX = 1, 4_294_967_294
#: Numbers in range that no router may use as its own or a peer's AS.
RESERVED_ASNS = {23456: "AS_TRANS (RFC 6793)", 65535: "reserved (RFC 7300)"}
#: Debian's FRR 8.4 is built with --enable-multipath=256.
MAX_PATHS = 256
#: Mininet names interfaces ``<node>-eth<port>``; Linux allows 15 characters.
IFNAMSIZ = 15
#: Names the lab's fabrics use for switches and hosts; a router must not take one.
FABRIC_NAME = re.compile(r"(spine|leaf|core|agg|edge|h)\d+")
NODE_NAME = re.compile(r"[a-z][a-z0-9]*")
BFD_PROFILE = "fabriclab"
OWN_PREFIXES = "FL-OWN"
OWN_ROUTE_MAP = "FL-OWN-OUT"


@dataclass
class Interface:
    """One end of a link: its Mininet name and the addresses on it."""

    name: str
    port: int
    peer: str
    peer_intf: str
    addresses: list[IPv4Interface] = field(default_factory=list)


@dataclass
class Neighbor:
    """A BGP session, resolved: whom it reaches, over which local interface."""

    address: IPv4Address
    remote_as: int
    peer: str
    interface: str
    bfd: bool = False


@dataclass
class _NeighborRequest:
    """A session as declared; resolved against the links by ``validate()``."""

    address: str
    remote_as: int | None
    bfd: bool


@dataclass
class Router:
    """An FRR router (zebra + bgpd, bfdd if a session uses BFD) in its own namespace."""

    name: str
    asn: int
    router_id: IPv4Address | None = None
    networks: list[IPv4Network] = field(default_factory=list)
    maximum_paths: int = 1
    multipath_relax: bool = False
    keepalive: int = 1
    holdtime: int = 3
    bfd_interval_ms: int = 100
    bfd_multiplier: int = 3
    #: How long bgpd gathers updates before sending them (FRR's default is 1000 ms, which
    #: alone delays the first multipath route by a second after the sessions are up).
    coalesce_ms: int = 50
    #: ``net.ipv4.fib_multipath_hash_policy`` for this namespace (None: kernel default, 0).
    hash_policy: int | None = None
    #: False: announce only ``networks`` and ``announce`` to eBGP peers (an edge that is
    #: nobody's transit).
    transit: bool = True
    #: Prefixes learnt from iBGP that a non-transit router passes on to its eBGP peers
    #: (a border announcing the DC prefix its core originates, without a ``network`` line
    #: that would make the border itself the origin).
    announce: list[IPv4Network] = field(default_factory=list)
    interfaces: list[Interface] = field(default_factory=list)
    neighbors: list[Neighbor] = field(default_factory=list)
    requests: list[_NeighborRequest] = field(default_factory=list, repr=False)

    @property
    def uses_bfd(self) -> bool:
        return any(n.bfd for n in self.neighbors)

    def addresses(self) -> list[IPv4Interface]:
        return [a for i in self.interfaces for a in i.addresses]


@dataclass
class Host:
    """A plain end host (no routing daemon): addresses and a default gateway."""

    name: str
    gateway: IPv4Address | None = None
    interfaces: list[Interface] = field(default_factory=list)


@dataclass
class Link:
    """A point-to-point link; ``pairs`` are the (a-end, b-end) addresses on it."""

    a: str
    a_port: int
    b: str
    b_port: int
    pairs: list[tuple[IPv4Interface, IPv4Interface]]
    bw: float
    bgp: bool
    bfd: bool

    @property
    def a_intf(self) -> str:
        return f"{self.a}-eth{self.a_port}"

    @property
    def b_intf(self) -> str:
        return f"{self.b}-eth{self.b_port}"


Subnet = str | tuple[str, str]


def check_asn(fld: str, value: object) -> int:
    asn = check_int(fld, value, ASN_MIN, ASN_MAX)
    if asn in RESERVED_ASNS:
        raise TopologyError(fld, f"AS {asn} is {RESERVED_ASNS[asn]} and cannot be used")
    return asn


def _pair(fld: str, subnet: Subnet) -> tuple[IPv4Interface, IPv4Interface]:
    """A link subnet as the two end addresses: "net/len" takes its first two host addresses."""
    try:
        if isinstance(subnet, str):
            net = IPv4Network(subnet, strict=True)
            hosts = list(net.hosts()) if net.num_addresses <= 4 else [
                net.network_address + 1, net.network_address + 2]
            if len(hosts) < 2:
                raise TopologyError(fld, f"{subnet} has no room for two ends")
            return (IPv4Interface(f"{hosts[0]}/{net.prefixlen}"),
                    IPv4Interface(f"{hosts[1]}/{net.prefixlen}"))
        a, b = (IPv4Interface(s) for s in subnet)
    except (ValueError, TypeError) as exc:
        raise TopologyError(fld, f"bad subnet {subnet!r}: {exc}") from None
    if a.network != b.network:
        raise TopologyError(fld, f"{a} and {b} are not in one subnet")
    if a.ip == b.ip:
        raise TopologyError(fld, f"both ends have the address {a.ip}")
    if a.network.prefixlen < 31:
        for end in (a, b):
            if end.ip in (end.network.network_address, end.network.broadcast_address):
                raise TopologyError(fld, f"{end} is the network or broadcast address")
    return a, b


class BgpNetwork:
    """Routers, hosts and links, declared in any order; ``validate()`` resolves sessions.

    Port numbers (and so interface names ``<node>-eth<port>``) are handed out here, in the
    order links are added, so the generated configs and the Mininet topology agree on names.
    """

    def __init__(self) -> None:
        self.routers: dict[str, Router] = {}
        self.hosts: dict[str, Host] = {}
        self.links: list[Link] = []
        self._ports: dict[str, int] = {}
        self._validated = False

    # -- declaring ----------------------------------------------------------------------------
    def _check_name(self, kind: str, name: object) -> str:
        fld = f"{kind}.{name}"
        if not isinstance(name, str) or not NODE_NAME.fullmatch(name):
            raise TopologyError(fld, "a node name is lower-case letters and digits, "
                                "starting with a letter")
        if len(name) + len("-eth") + 2 > IFNAMSIZ:
            raise TopologyError(fld, f"too long: interface names {name}-ethNN must fit in "
                                f"{IFNAMSIZ} characters")
        if FABRIC_NAME.fullmatch(name):
            raise TopologyError(fld, "this name belongs to the lab's fabric nodes "
                                "(spineN, leafN, coreN, aggN, edgeN, hN)")
        if name in self.routers or name in self.hosts:
            raise TopologyError(fld, "duplicate node name")
        return name

    def add_router(self, name: str, asn: int, *, router_id: str | None = None,
                   networks: Iterable[str] = (), maximum_paths: int = 1,
                   multipath_relax: bool = False, keepalive: int = 1, holdtime: int = 3,
                   bfd_interval_ms: int = 100, bfd_multiplier: int = 3, coalesce_ms: int = 50,
                   hash_policy: int | None = None, transit: bool = True,
                   announce: Iterable[str] = ()) -> Router:
        name = self._check_name("routers", name)
        fld = f"routers.{name}"
        r = Router(name=name, asn=check_asn(f"{fld}.asn", asn),
                   maximum_paths=check_int(f"{fld}.maximum_paths", maximum_paths, 1,
                                            MAX_PATHS),
                   multipath_relax=bool(multipath_relax), transit=bool(transit),
                   keepalive=check_int(f"{fld}.keepalive", keepalive, 1, 21845),
                   holdtime=check_int(f"{fld}.holdtime", holdtime, 3, 65535),
                   bfd_interval_ms=check_int(f"{fld}.bfd_interval_ms", bfd_interval_ms, 10,
                                              60000),
                   bfd_multiplier=check_int(f"{fld}.bfd_multiplier", bfd_multiplier, 2, 255),
                   coalesce_ms=check_int(f"{fld}.coalesce_ms", coalesce_ms, 0, 60000))
        if r.keepalive * 3 > r.holdtime:
            raise TopologyError(f"{fld}.holdtime", f"hold time {r.holdtime} s is less than "
                                f"three keepalives ({r.keepalive} s)")
        if hash_policy is not None:
            # Which values exist is the kernel's business (probed where it runs, see
            # lab.net.frr.probe_hash_policy); that it is a non-negative integer is ours.
            r.hash_policy = check_int(f"{fld}.hash_policy", hash_policy, 0, 2**31 - 1)
        if router_id is not None:
            try:
                r.router_id = IPv4Address(router_id)
            except ValueError as exc:
                raise TopologyError(f"{fld}.router_id", str(exc)) from None
        for key, nets, into in (("networks", networks, r.networks),
                                ("announce", announce, r.announce)):
            for net in nets:
                try:
                    into.append(IPv4Network(net, strict=True))
                except (ValueError, TypeError) as exc:
                    raise TopologyError(f"{fld}.{key}", f"{net!r}: {exc}") from None
        self.routers[name] = r
        self._validated = False
        return r

    def add_host(self, name: str, *, gateway: str | None = None) -> Host:
        name = self._check_name("hosts", name)
        h = Host(name=name)
        if gateway is not None:
            try:
                h.gateway = IPv4Address(gateway)
            except ValueError as exc:
                raise TopologyError(f"hosts.{name}.gateway", str(exc)) from None
        self.hosts[name] = h
        return h

    def _node(self, fld: str, name: str) -> Router | Host:
        node = self.routers.get(name) or self.hosts.get(name)
        if node is None:
            raise TopologyError(fld, f"unknown node {name!r}")
        return node

    def add_link(self, a: str, b: str, *subnets: Subnet, bgp: bool = True, bfd: bool = False,
                 bw: float = 100.0) -> Link:
        """Link ``a`` and ``b`` with one address pair per subnet.

        Between two routers ``bgp=True`` configures a session each way over the first pair
        (``bfd=True`` adds BFD to it); a host takes the router's first address as gateway.
        """
        fld = f"links.{a}-{b}"
        na, nb = self._node(fld, a), self._node(fld, b)
        if a == b:
            raise TopologyError(fld, "a link needs two different nodes")
        if not subnets:
            raise TopologyError(fld, "a link needs at least one subnet")
        if isinstance(bw, bool) or not isinstance(bw, (int, float)) or bw <= 0:
            raise TopologyError(f"{fld}.bw", f"expected a rate in Mbit/s, got {bw!r}")
        pairs = [_pair(fld, s) for s in subnets]
        for side, node in ((0, na), (1, nb)):
            mine = {x.ip for i in node.interfaces for x in i.addresses}
            for p in pairs:
                if p[side].ip in mine:
                    raise TopologyError(fld, f"{node.name} already has {p[side].ip}")
        pa, pb = self._ports.get(a, 0), self._ports.get(b, 0)
        self._ports[a], self._ports[b] = pa + 1, pb + 1
        link = Link(a, pa, b, pb, pairs, float(bw), bool(bgp), bool(bfd))
        na.interfaces.append(Interface(link.a_intf, pa, b, link.b_intf, [p[0] for p in pairs]))
        nb.interfaces.append(Interface(link.b_intf, pb, a, link.a_intf, [p[1] for p in pairs]))
        if bgp and isinstance(na, Router) and isinstance(nb, Router):
            na.requests.append(_NeighborRequest(str(pairs[0][1].ip), None, bool(bfd)))
            nb.requests.append(_NeighborRequest(str(pairs[0][0].ip), None, bool(bfd)))
        self.links.append(link)
        self._validated = False
        return link

    def add_external(self, router: str, peer: str, address: str) -> Interface:
        """An interface of ``router`` towards a node outside the plan (e.g. an OVS switch).

        The router gets the address and the interface name; sessions cannot use it, since
        nothing at its far end is known here.
        """
        fld = f"routers.{router}.interfaces"
        r = self.routers.get(router)
        if r is None:
            raise TopologyError(f"routers.{router}", "unknown router")
        try:
            addr = IPv4Interface(address)
        except ValueError as exc:
            raise TopologyError(fld, f"bad address {address!r}: {exc}") from None
        if addr.ip in {a.ip for a in r.addresses()}:
            raise TopologyError(fld, f"{router} already has {addr.ip}")
        port = self._ports.get(router, 0)
        self._ports[router] = port + 1
        intf = Interface(f"{router}-eth{port}", port, peer, "", [addr])
        r.interfaces.append(intf)
        self._validated = False
        return intf

    def add_neighbor(self, router: str, address: str, *, remote_as: int | None = None,
                     bfd: bool = False) -> None:
        """An explicit session to ``address``, which must be the far end of one of its links."""
        r = self.routers.get(router)
        if r is None:
            raise TopologyError(f"routers.{router}", "unknown router")
        if remote_as is not None:
            check_asn(f"routers.{router}.neighbors.remote_as", remote_as)
        r.requests.append(_NeighborRequest(address, remote_as, bool(bfd)))
        self._validated = False

    # -- checking -----------------------------------------------------------------------------
    def _far_end(self, r: Router, address: IPv4Address) -> tuple[Interface, str] | None:
        """(local interface, far node) of the link where ``address`` is the far end's."""
        for intf in r.interfaces:
            far = self.routers.get(intf.peer) or self.hosts.get(intf.peer)
            if far is None:     # an external attachment: nothing known beyond it
                continue
            far_intf = next(i for i in far.interfaces if i.name == intf.peer_intf)
            for mine, theirs in zip(intf.addresses, far_intf.addresses, strict=True):
                if theirs.ip == address and mine.network == theirs.network:
                    return intf, far.name
        return None

    def validate(self) -> BgpNetwork:
        """Resolve every session against the links; refuse what FRR could not run."""
        if not self.routers:
            raise TopologyError("routers", "no routers declared")
        ids: dict[IPv4Address, str] = {}
        for r in self.routers.values():
            fld = f"routers.{r.name}"
            r.neighbors = []
            seen: set[IPv4Address] = set()
            for req in r.requests:
                try:
                    addr = IPv4Address(req.address)
                except ValueError as exc:
                    raise TopologyError(f"{fld}.neighbors", str(exc)) from None
                if addr in seen:
                    raise TopologyError(f"{fld}.neighbors", f"{addr} is configured twice")
                seen.add(addr)
                hit = self._far_end(r, addr)
                if hit is None:
                    raise TopologyError(f"{fld}.neighbors", f"{addr} is on no link of "
                                        f"{r.name}: a session needs a directly linked peer")
                intf, peer = hit
                peer_router = self.routers.get(peer)
                if peer_router is None:
                    raise TopologyError(f"{fld}.neighbors", f"{addr} belongs to host {peer}, "
                                        "which runs no BGP")
                if req.remote_as is not None and req.remote_as != peer_router.asn:
                    raise TopologyError(f"{fld}.neighbors", f"{addr} is {peer}, AS "
                                        f"{peer_router.asn}, not AS {req.remote_as}")
                r.neighbors.append(Neighbor(addr, peer_router.asn, peer, intf.name, req.bfd))
            if r.router_id is None:
                addrs = sorted(a.ip for a in r.addresses())
                if not addrs:
                    raise TopologyError(f"{fld}.router_id", "no addresses to take a router-id "
                                        "from; give one")
                r.router_id = addrs[0]
            if r.router_id in ids:
                raise TopologyError(f"{fld}.router_id", f"{r.router_id} is also the router-id "
                                    f"of {ids[r.router_id]}")
            ids[r.router_id] = r.name
        for h in self.hosts.values():
            if h.gateway is None:
                for intf in h.interfaces:
                    if intf.peer in self.routers:
                        far = next(i for i in self.routers[intf.peer].interfaces
                                   if i.name == intf.peer_intf)
                        h.gateway = far.addresses[0].ip
                        break
        self._validated = True
        return self

    def router(self, name: str) -> Router:
        if not self._validated:
            self.validate()
        return self.routers[name]

    # -- generating ---------------------------------------------------------------------------
    def configs(self, name: str) -> dict[str, str]:
        """The config files of router ``name``: zebra.conf, bgpd.conf and, if used, bfdd.conf."""
        r = self.router(name)
        out = {"zebra.conf": zebra_conf(r), "bgpd.conf": bgpd_conf(r)}
        if r.uses_bfd:
            out["bfdd.conf"] = bfdd_conf(r)
        return out


def _header(r: Router, daemon: str) -> list[str]:
    return [f"! {daemon}.conf for {r.name}, generated by FabricLab (lab/net/bgp.py): do not edit",
            "frr version 8.4", "frr defaults traditional", f"hostname {r.name}", "!"]


def zebra_conf(r: Router) -> str:
    """Interfaces only: addresses are set by the lab before zebra starts, zebra learns them."""
    lines = _header(r, "zebra")
    for intf in r.interfaces:
        lines += [f"interface {intf.name}", f" description to {intf.peer}"
                  + (f" ({intf.peer_intf})" if intf.peer_intf else ""),
                  "exit", "!"]
    return "\n".join(lines) + "\n"


def bfdd_conf(r: Router) -> str:
    """One profile the sessions refer to; bgpd registers its BFD peers through zebra."""
    lines = [
        *_header(r, "bfdd"), "bfd", f" profile {BFD_PROFILE}",
        f"  detect-multiplier {r.bfd_multiplier}",
        f"  receive-interval {r.bfd_interval_ms}", f"  transmit-interval {r.bfd_interval_ms}",
        " exit", "exit", "!"]
    return "\n".join(lines) + "\n"


def bgpd_conf(r: Router) -> str:
    lines = _header(r, "bgpd")
    ebgp = [n for n in r.neighbors if n.remote_as != r.asn]
    if not r.transit and ebgp:
        # Announce our own prefixes only: an edge with two ISPs must not carry ISP1 to ISP2.
        own = r.networks + r.announce
        if own:
            lines += [f"ip prefix-list {OWN_PREFIXES} seq {5 * (i + 1)} permit {net}"
                      for i, net in enumerate(own)]
        else:
            lines.append(f"ip prefix-list {OWN_PREFIXES} seq 5 deny any")
        lines += [f"route-map {OWN_ROUTE_MAP} permit 10",
                  f" match ip address prefix-list {OWN_PREFIXES}", "exit", "!"]
    lines += [f"router bgp {r.asn}", f" bgp router-id {r.router_id}",
              " no bgp ebgp-requires-policy", " no bgp default ipv4-unicast",
              " bgp log-neighbor-changes", f" timers bgp {r.keepalive} {r.holdtime}",
              f" coalesce-time {r.coalesce_ms}"]
    if r.multipath_relax:
        lines.append(" bgp bestpath as-path multipath-relax")
    for n in r.neighbors:
        a = n.address
        lines += [f" neighbor {a} remote-as {n.remote_as}",
                  f" neighbor {a} description {n.peer} via {n.interface}",
                  f" neighbor {a} timers {r.keepalive} {r.holdtime}",
                  f" neighbor {a} timers connect 1",
                  f" neighbor {a} advertisement-interval 0"]
        if n.bfd:
            lines += [f" neighbor {a} bfd", f" neighbor {a} bfd profile {BFD_PROFILE}"]
    lines += [" !", " address-family ipv4 unicast"]
    lines += [f"  network {net}" for net in r.networks]
    if r.maximum_paths > 1:
        lines += [f"  maximum-paths {r.maximum_paths}",
                  f"  maximum-paths ibgp {r.maximum_paths}"]
    for n in r.neighbors:
        lines.append(f"  neighbor {n.address} activate")
        if n.remote_as == r.asn:
            lines.append(f"  neighbor {n.address} next-hop-self")
        elif not r.transit:
            lines.append(f"  neighbor {n.address} route-map {OWN_ROUTE_MAP} out")
    lines += [" exit-address-family", "exit", "!"]
    return "\n".join(lines) + "\n"
