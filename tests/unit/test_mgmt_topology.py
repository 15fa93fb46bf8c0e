"""The management network as a topology describes it: off by default, a separate LAN with
its own subnet when asked for, counted by telemetry under its own role, refused clearly
where it cannot be. Nothing is built."""

from ipaddress import IPv4Address, IPv4Network

import pytest

from controllers import config
from lab.measure import telemetry
from lab.model.errors import TopologyError
from lab.net.topobase import (
    MGMT_SUBNET,
    MGMT_SWITCH,
    check_mgmt_bw,
    host_addr,
    mgmt_addr,
    planned_names,
)
from lab.net.topologies import FatTree, LeafSpine, describe, make_topology


def without_mgmt(desc: dict) -> dict:
    """A description as it would be without the management network."""
    out = {k: v for k, v in desc.items() if k != "mgmt"}
    out["params"] = {k: v for k, v in desc["params"].items() if k != "mgmt_bw"}
    return out


def test_absent_by_default_and_zero_means_absent():
    default = describe(LeafSpine(spines=2, leaves=2, hosts_per_leaf=2))
    zero = describe(LeafSpine(spines=2, leaves=2, hosts_per_leaf=2, mgmt_bw=0))
    assert "mgmt" not in default and "mgmt_bw" not in default["params"]
    assert zero == default
    bridges, intfs = planned_names(LeafSpine(spines=2, leaves=2, hosts_per_leaf=2))
    assert MGMT_SWITCH not in bridges
    assert not [i for i in intfs if i.startswith(MGMT_SWITCH)]
    assert telemetry.mgmt_ports(default) == []


def test_the_fabric_is_described_exactly_as_without_it():
    with_mgmt = describe(LeafSpine(spines=2, leaves=3, hosts_per_leaf=2, mgmt_bw=10))
    plain = describe(LeafSpine(spines=2, leaves=3, hosts_per_leaf=2))
    assert without_mgmt(with_mgmt) == plain
    assert with_mgmt["params"]["mgmt_bw"] == 10.0
    # the controller's config comes from the fabric sections only: it never sees the LAN
    cfg = config.build(with_mgmt, "ovs-select", 1)
    assert cfg == config.build(plain, "ovs-select", 1)
    assert telemetry.fabric_ports(with_mgmt) == telemetry.fabric_ports(plain)


def test_one_switch_and_one_shaped_link_per_host():
    d = describe(LeafSpine(spines=2, leaves=2, hosts_per_leaf=3, mgmt_bw=10,
                           queue_bytes=60_000))["mgmt"]
    assert d["subnet"] == MGMT_SUBNET and d["bw_mbps"] == 10.0
    assert [s["name"] for s in d["switches"]] == [MGMT_SWITCH]
    assert d["switches"][0]["role"] == "mgmt"
    links = sorted(d["links"], key=lambda ln: ln["b_port"])
    assert [(ln["a"], ln["a_port"], ln["b"], ln["b_port"]) for ln in links] == [
        (f"h{n}", 1, MGMT_SWITCH, n) for n in range(1, 7)]
    assert {(ln["bw_mbps"], ln["queue_bytes"], ln["role"]) for ln in links} == {
        (10.0, 60_000, "mgmt")}
    assert [h["intf"] for h in d["hosts"]] == [f"h{n}-eth1" for n in range(1, 7)]


def test_the_link_itself_is_shaped_and_addressed():
    """What Mininet gets for each management link: the lab's shaping, and the host end's
    address and MAC (the description is read from the same links)."""
    topo = LeafSpine(spines=1, leaves=1, hosts_per_leaf=2, mgmt_bw=20)
    info = next(i for a, b, i in topo.links(withInfo=True) if MGMT_SWITCH in (a, b))
    assert info["bw"] == 20.0 and info["queue_bytes"] == topo.params["queue_bytes"]
    assert info["params1"] == {"ip": f"{mgmt_addr(1).ip}/16"}
    assert info["addr1"] == mgmt_addr(1).mac


def test_addresses_are_on_their_own_subnet_and_unique():
    subnet = IPv4Network(MGMT_SUBNET)
    fabric = IPv4Network("10.0.0.0/8")
    assert not subnet.overlaps(fabric)
    addrs = [mgmt_addr(n) for n in range(1, 257)]
    assert len({a.ip for a in addrs}) == len({a.mac for a in addrs}) == 256
    assert all(IPv4Address(a.ip) in subnet for a in addrs)
    assert not {a.mac for a in addrs} & {host_addr(n).mac for n in range(1, 257)}
    d = describe(FatTree(k=4, mgmt_bw=10))
    assert [h["ip"] for h in d["mgmt"]["hosts"]] == [mgmt_addr(n).ip for n in range(1, 17)]


def test_planned_names_include_the_lan_so_cleanup_removes_it():
    bridges, intfs = planned_names(LeafSpine(spines=1, leaves=2, hosts_per_leaf=2, mgmt_bw=5))
    assert MGMT_SWITCH in bridges
    assert {f"{MGMT_SWITCH}-eth{n}" for n in range(1, 5)} <= set(intfs)


def test_telemetry_counts_the_lan_under_its_own_role():
    d = describe(LeafSpine(spines=2, leaves=2, hosts_per_leaf=2, mgmt_bw=10))
    ports = telemetry.mgmt_ports(d)
    assert [(p.node, p.port, p.peer, p.intf, p.bw_mbps, p.role) for p in ports] == [
        (MGMT_SWITCH, n, f"h{n}", f"{MGMT_SWITCH}-eth{n}", 10.0, "mgmt") for n in range(1, 5)]
    assert {p.role for p in telemetry.fabric_ports(d)} == {"fabric"}


def test_fattree_has_it_too():
    d = describe(FatTree(k=4, mgmt_bw=10))
    assert len(d["mgmt"]["links"]) == 16
    assert without_mgmt(d) == describe(FatTree(k=4))


@pytest.mark.parametrize("value", [-1, -0.5, 5000, "fast", True, None, [10]])
def test_bad_rates_are_refused_naming_the_field(value):
    with pytest.raises(TopologyError) as exc:
        make_topology({"type": "leafspine", "mgmt_bw": value})
    assert exc.value.field == "topology.mgmt_bw"
    with pytest.raises(TopologyError) as exc:
        make_topology({"type": "fattree", "mgmt_bw": value})
    assert exc.value.field == "topology.mgmt_bw"


def test_zero_in_any_number_form_is_none():
    assert check_mgmt_bw(0) == check_mgmt_bw(0.0) == 0.0
    assert check_mgmt_bw(10) == 10.0


def test_the_streaming_edge_refuses_it():
    with pytest.raises(TopologyError) as exc:
        make_topology({"type": "streaming-edge", "mgmt_bw": 10})
    assert exc.value.field == "topology.mgmt_bw"


def test_the_lan_switch_counts_against_the_machine_limit():
    make_topology({"type": "leafspine", "spines": 64, "leaves": 64, "hosts_per_leaf": 1})
    with pytest.raises(TopologyError) as exc:
        make_topology({"type": "leafspine", "spines": 64, "leaves": 64, "hosts_per_leaf": 1,
                       "mgmt_bw": 10})
    assert exc.value.field == "topology.hosts_per_leaf"
