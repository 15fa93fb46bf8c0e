"""What every topology is made of: rates, queues and size limits, host addresses, the
checks of a topology's parameters, the names a topology will create (``planned_names``), and
``FabricTopo`` (Mininet's ``Topo`` with the lab's links, and what it adds to its description).

Everything here is what the fabric (``lab.net.fabric``), the FRR routers (``lab.net.frr``),
the BGP edge (``lab.net.edge``) and the topologies' registry (``lab.net.topologies``) share,
so it sits below all of them: the registry imports the edge, the edge the routers, and none
of them needs to import back up.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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
#: same cores. Measured on the 2-core CI machine (docs/scale.md): a
#: fat-tree k=4 runs with valid fidelity, k=6 and k=8 come up (12 s, 35 s) but their runs
#: are CPU-bound and flagged invalid; beyond this limit bring-up alone takes minutes. A
#: bigger machine moves the fidelity line, not this guard. Planning a split over several
#: machines (``fabriclab topo --workers``) is not bound by it.
MAX_SWITCHES = 128
MAX_HOSTS = 256
_machine_limits: ContextVar[bool] = ContextVar("machine_limits", default=True)

_DPID_BASE = {"spine": 0x100, "core": 0x100, "leaf": 0x200, "agg": 0x200, "edge": 0x300}

#: The management network (``FabricTopo.add_mgmt_network``): one plain L2 switch, outside
#: the fabric, and a second interface on every host. Its subnet is disjoint from the fabric's
#: 10.0.0.0/8 and from the BGP edge's pools (172.16.0.0/16, the documentation ranges), so an
#: address says which network it is on and no route can send one network's traffic into
#: the other.
MGMT_SWITCH = "mgmt1"
MGMT_SUBNET = "192.168.0.0/16"
MGMT_ROLE = "mgmt"
_MGMT_DPID = 0x401
#: A host's management interface is its port 1 (``hN-eth1``); port 0 is its fabric NIC.
MGMT_HOST_PORT = 1


@dataclass(frozen=True)
class HostAddr:
    ip: str
    mac: str


def host_addr(n: int) -> HostAddr:
    """Address of host ``h<n>``: 10.0.0.n/8 style, unique for n < 2**16."""
    return HostAddr(ip=f"10.0.{n >> 8}.{n & 0xFF}", mac=f"00:00:00:00:{n >> 8:02x}:{n & 0xFF:02x}")


def mgmt_addr(n: int) -> HostAddr:
    """Management address of host ``h<n>``: 192.168.0.n/16 style, unique for n < 2**16,
    with a locally administered MAC (02:...) that no fabric MAC can equal."""
    return HostAddr(ip=f"192.168.{n >> 8}.{n & 0xFF}",
                    mac=f"02:00:00:01:{n >> 8:02x}:{n & 0xFF:02x}")


def check_rate(field: str, value: object) -> float:
    """A link rate in Mbit/s that the link model shapes faithfully, refused naming ``field``
    otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TopologyError(field, f"expected a rate in Mbit/s, got {value!r}")
    if not 0 < value <= MAX_LINK_MBPS:
        raise TopologyError(field, f"{value} Mbit/s is a rate the link model cannot do "
                            f"faithfully (0 < rate <= {MAX_LINK_MBPS:g} Mbit/s)")
    return float(value)


@contextmanager
def size_guard(enabled: bool) -> Iterator[None]:
    """Within the block, ``check_size`` holds topologies to one machine's limits (the
    default) or not: planning a split over several machines describes fabrics larger than
    one could bring up, and never brings them up."""
    token = _machine_limits.set(enabled)
    try:
        yield
    finally:
        _machine_limits.reset(token)


def check_size(field: str, what: str, switches: int, hosts: int) -> None:
    """Refuse, naming ``field``, a fabric larger than MAX_SWITCHES or MAX_HOSTS."""
    if _machine_limits.get() and (switches > MAX_SWITCHES or hosts > MAX_HOSTS):
        raise TopologyError(field, f"{what} gives {switches} switches and {hosts} hosts, more "
                            f"than one machine emulates faithfully (at most {MAX_SWITCHES} "
                            f"switches and {MAX_HOSTS} hosts)")


def check_links(host_bw: object, fabric_bw: object,
                queue_bytes: object) -> tuple[float, float, int]:
    """The link parameters every fabric shares, checked (each topology's ``build`` checks
    them before it adds a node, so a bad value is refused naming its field)."""
    return (check_rate("topology.host_bw", host_bw),
            check_rate("topology.fabric_bw", fabric_bw),
            check_int("topology.queue_bytes", queue_bytes, 3000, 64_000_000))


def check_mgmt_bw(value: object) -> float:
    """The management network's link rate; 0 (the default) means there is none.

    Any other value is a link rate like every other (refused naming ``topology.mgmt_bw``)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
        return 0.0
    return check_rate("topology.mgmt_bw", value)


#: The fabric's own link parameters (switch to switch), as a scenario names them.
NETEM_FIELDS = ("topology.link_delay_ms", "topology.link_jitter_ms", "topology.link_loss_pct")


def check_fabric_netem(delay_ms: object, jitter_ms: object, loss_pct: object) -> Netem:
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


def planned_names(topo: Topo) -> tuple[list[str], list[str]]:
    """(OVS bridges, root-namespace interfaces) the topology will create.

    Mininet names an interface ``<node>-eth<port>``; switch ends live in the root namespace,
    host ends in the hosts' namespaces (those vanish with the namespace). The fabric records
    both before it creates them; the routers' own Mininet only the interfaces (it has no
    switches).
    """
    bridges = list(topo.switches())
    intfs = []
    switch_set = set(bridges)
    for a, b, info in topo.links(withInfo=True):
        for node, port in ((a, info["port1"]), (b, info["port2"])):
            if node in switch_set:
                intfs.append(f"{node}-eth{port}")
    return bridges, intfs


class FabricTopo(Topo):
    """Common bookkeeping: tiers, host addresses, link rates, oversubscription."""

    kind = "fabric"

    def __init__(self, **params: object) -> None:
        self.roles: dict[str, str] = {}
        self.params: dict[str, object] = {}
        self.oversubscription = 1.0
        #: The management network's link rate (0: none) and its hosts, by index.
        self.mgmt_bw = 0.0
        self.mgmt_hosts: list[str] = []
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

    def add_mgmt_network(self, bw: float, queue_bytes: int) -> None:
        """A management LAN: switch ``mgmt1`` and a link from every host's port 1 to it.

        The links are shaped like every lab link (``shaped``), so their bytes and drops are
        counted the same way. The switch has role ``mgmt``: it is not on the fabric, so the
        controller is never told about it and the fabric brings it up as a standalone
        learning bridge (``lab.net.fabric``). Host ``hN`` is on switch port N. Nothing is
        added for ``bw`` 0.
        """
        if not bw:
            return
        self.mgmt_bw = bw
        self.addSwitch(MGMT_SWITCH, dpid=f"{_MGMT_DPID:016x}", protocols="OpenFlow13")
        self.roles[MGMT_SWITCH] = MGMT_ROLE
        hosts = sorted((h for h in self.hosts() if self.roles.get(h) == "host"),
                       key=lambda h: int(h[1:]))
        for host in hosts:
            n = int(host[1:])
            addr = mgmt_addr(n)
            self.addLink(host, MGMT_SWITCH, port1=MGMT_HOST_PORT, port2=n, addr1=addr.mac,
                         params1={"ip": f"{addr.ip}/{MGMT_SUBNET.split('/')[1]}"},
                         **self.shaped(bw, queue_bytes))
            self.mgmt_hosts.append(host)

    def mgmt_switches(self) -> frozenset[str]:
        """The switches of the management network (none without one)."""
        return frozenset(n for n, r in self.roles.items() if r == MGMT_ROLE)

    def describe_mgmt(self) -> dict[str, object]:
        """The ``mgmt`` section of the description, or nothing without a management network.

        Apart from ``switches``, ``hosts`` and ``links`` on purpose: every consumer of those
        (the controller's config, paths, capacities, plots) means the fabric, and must not
        route over or count a LAN it does not program.
        """
        if not self.mgmt_bw:
            return {}
        switches = [{"name": n, "role": MGMT_ROLE, "dpid": int(str(self.nodeInfo(n)["dpid"]), 16)}
                    for n in sorted(self.mgmt_switches())]
        hosts, links = [], []
        for a, b, info in self.links(sort=False, withInfo=True):
            if self.roles.get(b) != MGMT_ROLE:
                continue
            addr = mgmt_addr(int(a[1:]))
            hosts.append({"name": a, "ip": addr.ip, "mac": addr.mac,
                          "intf": f"{a}-eth{info['port1']}"})
            links.append({"a": a, "a_port": info["port1"], "b": b, "b_port": info["port2"],
                          "bw_mbps": info["bw"], "queue_bytes": info["queue_bytes"],
                          "delay_ms": 0.0, "role": MGMT_ROLE})
        return {"mgmt": {"subnet": MGMT_SUBNET, "bw_mbps": self.mgmt_bw, "switches": switches,
                         "hosts": hosts, "links": links}}

    def role(self, name: str) -> str:
        return self.roles[name]

    def on_fabric(self, name: str) -> bool:
        """Switches, hosts and gateways: what the controller programs and forwards for.

        Routers and hosts behind them (``lab.net.edge``) are outside the fabric."""
        return self.roles.get(name) in {"host", "media", "origin", "gateway",
                                        *_DPID_BASE}

    # -- what a topology adds to its description (``lab.net.topologies.describe``) -----------
    def describe_switch(self, name: str) -> dict[str, object]:
        """Fields of switch ``name``'s entry beyond name, role and dpid (a fat-tree's pod).

        The topology says what it has, so the description never asks which class it is."""
        return {}

    def describe_extras(self) -> dict[str, object]:
        """Sections of the description beyond the fabric's switches, hosts and links (the
        BGP edge's routers, their links and the hosts behind them)."""
        return {}
