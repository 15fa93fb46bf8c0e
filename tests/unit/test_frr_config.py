"""The BGP edge model and the FRR configs it generates: refusals, sessions, exact lines.

No root and no daemons: where FRR is installed, its own parser (``vtysh -C``) also checks the
generated text, since bgpd's ``-C`` accepts unknown commands with exit status 0.
"""

from __future__ import annotations

import shutil

import pytest

from lab.model.errors import TopologyError
from lab.net.bgp import BgpNetwork

needs_vtysh = pytest.mark.skipif(shutil.which("vtysh") is None, reason="FRR not installed")


def edge() -> BgpNetwork:
    """border1 with two links to isp1 and one to isp2; a host behind each ISP and the DC."""
    net = BgpNetwork()
    net.add_router("border1", 65000, networks=["192.0.2.0/24"], maximum_paths=4,
                   multipath_relax=True, transit=False, hash_policy=1)
    net.add_router("isp1", 65001, networks=["198.51.100.0/24", "203.0.113.0/24"],
                   maximum_paths=4)
    net.add_router("isp2", 65002, networks=["203.0.113.0/24"])
    for h in ("dc1", "cdn1", "cdn2"):
        net.add_host(h)
    net.add_link("border1", "isp1", "10.0.1.0/30")
    net.add_link("border1", "isp1", "10.0.1.4/30")
    net.add_link("border1", "isp2", "10.0.2.0/30", bfd=True)
    net.add_link("border1", "dc1", ("192.0.2.1/24", "192.0.2.10/24"))
    net.add_link("isp1", "cdn1", ("198.51.100.1/24", "198.51.100.10/24"),
                 ("203.0.113.1/24", "203.0.113.10/24"))
    net.add_link("isp2", "cdn2", ("203.0.113.1/24", "203.0.113.10/24"))
    return net.validate()


def error_field(fn, *args, **kwargs) -> str:
    with pytest.raises(TopologyError) as exc:
        fn(*args, **kwargs)
    return exc.value.field


# -- the model --------------------------------------------------------------------------------
def test_links_name_interfaces_like_mininet_and_sessions_follow_links():
    net = edge()
    b = net.router("border1")
    assert [i.name for i in b.interfaces] == ["border1-eth0", "border1-eth1", "border1-eth2",
                                              "border1-eth3"]
    assert [(str(n.address), n.remote_as, n.peer, n.interface, n.bfd) for n in b.neighbors] == [
        ("10.0.1.2", 65001, "isp1", "border1-eth0", False),
        ("10.0.1.6", 65001, "isp1", "border1-eth1", False),
        ("10.0.2.2", 65002, "isp2", "border1-eth2", True)]
    assert [str(n.address) for n in net.router("isp1").neighbors] == ["10.0.1.1", "10.0.1.5"]
    # isp1's second link is its eth1; cdn1 sits on eth2 with two prefixes on one link
    assert [str(a) for a in net.router("isp1").interfaces[2].addresses] == [
        "198.51.100.1/24", "203.0.113.1/24"]
    assert str(net.hosts["cdn1"].gateway) == "198.51.100.1"
    assert str(net.hosts["dc1"].gateway) == "192.0.2.1"
    assert str(b.router_id) == "10.0.1.1"   # lowest own address unless given
    assert b.uses_bfd and net.router("isp2").uses_bfd and not net.router("isp1").uses_bfd


def test_explicit_neighbour_by_interface_address_and_ibgp():
    net = BgpNetwork()
    net.add_router("border1", 65000, maximum_paths=2)
    net.add_router("border2", 65000, maximum_paths=2)
    net.add_link("border1", "border2", "10.9.0.0/31", bgp=False)
    net.add_neighbor("border1", "10.9.0.1")
    net.add_neighbor("border2", "10.9.0.0", remote_as=65000, bfd=True)
    net.validate()
    n = net.router("border1").neighbors[0]
    assert (str(n.address), n.remote_as, n.interface) == ("10.9.0.1", 65000, "border1-eth0")
    conf = net.configs("border1")["bgpd.conf"]
    assert " neighbor 10.9.0.1 remote-as 65000" in conf
    assert "  neighbor 10.9.0.1 next-hop-self" in conf.splitlines()   # iBGP
    assert "  maximum-paths ibgp 2" in conf.splitlines()


def test_external_interface_gets_an_address_but_no_session():
    net = BgpNetwork()
    net.add_router("border1", 65000)
    intf = net.add_external("border1", "core1", "10.100.0.1/24")
    assert intf.name == "border1-eth0"
    net.add_neighbor("border1", "10.100.0.2", remote_as=65000)
    assert error_field(net.validate) == "routers.border1.neighbors"


# -- refusals: each names its field ---------------------------------------------------------
def test_duplicate_router_name():
    net = BgpNetwork()
    net.add_router("isp1", 65001)
    assert error_field(net.add_router, "isp1", 65002) == "routers.isp1"
    assert error_field(net.add_host, "isp1") == "hosts.isp1"


@pytest.mark.parametrize("asn", [0, -1, 4_294_967_295, 2**32, 23456, 65535, "65000", True])
def test_as_out_of_range(asn):
    assert error_field(BgpNetwork().add_router, "isp1", asn) == "routers.isp1.asn"


def test_maximum_paths_below_one():
    net = BgpNetwork()
    assert error_field(net.add_router, "r1x", 65000, maximum_paths=0) == \
        "routers.r1x.maximum_paths"
    assert error_field(net.add_router, "r1x", 65000, maximum_paths=257) == \
        "routers.r1x.maximum_paths"


def test_neighbour_on_no_link():
    net = BgpNetwork()
    net.add_router("border1", 65000)
    net.add_router("isp1", 65001)
    net.add_link("border1", "isp1", "10.0.1.0/30")
    net.add_neighbor("border1", "10.0.9.9")
    with pytest.raises(TopologyError) as exc:
        net.validate()
    assert exc.value.field == "routers.border1.neighbors"
    assert "10.0.9.9 is on no link" in exc.value.message


def test_neighbour_with_the_wrong_as_or_on_a_host():
    net = BgpNetwork()
    net.add_router("border1", 65000)
    net.add_router("isp1", 65001)
    net.add_host("cdn1")
    net.add_link("border1", "isp1", "10.0.1.0/30", bgp=False)
    net.add_link("border1", "cdn1", "10.0.3.0/30")
    net.add_neighbor("border1", "10.0.1.2", remote_as=65009)
    assert error_field(net.validate) == "routers.border1.neighbors"
    net2 = BgpNetwork()
    net2.add_router("border1", 65000)
    net2.add_host("cdn1")
    net2.add_link("border1", "cdn1", "10.0.3.0/30")
    net2.add_neighbor("border1", "10.0.3.2")
    with pytest.raises(TopologyError, match="host cdn1"):
        net2.validate()


@pytest.mark.parametrize(("kwargs", "fld"), [
    ({"holdtime": 2}, "routers.r1x.holdtime"),
    ({"keepalive": 2, "holdtime": 5}, "routers.r1x.holdtime"),
    ({"keepalive": 0}, "routers.r1x.keepalive"),
    ({"networks": ["10.0.0.1/24"]}, "routers.r1x.networks"),
    ({"router_id": "300.1.1.1"}, "routers.r1x.router_id"),
    ({"hash_policy": -1}, "routers.r1x.hash_policy"),
    ({"hash_policy": "l4"}, "routers.r1x.hash_policy"),
    ({"bfd_interval_ms": 1}, "routers.r1x.bfd_interval_ms"),
])
def test_router_options_refused(kwargs, fld):
    assert error_field(BgpNetwork().add_router, "r1x", 65000, **kwargs) == fld


@pytest.mark.parametrize("name", ["leaf1", "spine2", "h3", "Border", "1isp", "averyverylongname"])
def test_names_that_clash_or_do_not_fit_in_an_interface_name(name):
    assert error_field(BgpNetwork().add_router, name, 65000) == f"routers.{name}"


@pytest.mark.parametrize("subnet", ["10.0.1.1/30", "10.0.1.0/32", "nonsense",
                                    ("10.0.1.1/30", "10.0.2.2/30"),
                                    ("10.0.1.1/30", "10.0.1.1/30"),
                                    ("10.0.1.0/30", "10.0.1.1/30")])
def test_bad_link_subnets(subnet):
    net = BgpNetwork()
    net.add_router("border1", 65000)
    net.add_router("isp1", 65001)
    assert error_field(net.add_link, "border1", "isp1", subnet) == "links.border1-isp1"


def test_unknown_node_and_duplicate_router_id():
    net = BgpNetwork()
    net.add_router("border1", 65000, router_id="1.1.1.1")
    net.add_router("isp1", 65001, router_id="1.1.1.1")
    assert error_field(net.add_link, "border1", "isp9", "10.0.1.0/30") == "links.border1-isp9"
    net.add_link("border1", "isp1", "10.0.1.0/30")
    assert error_field(net.validate) == "routers.isp1.router_id"


# -- generated text ---------------------------------------------------------------------------
def test_bgpd_conf_lines():
    lines = edge().configs("border1")["bgpd.conf"].splitlines()
    for want in ["router bgp 65000", " bgp router-id 10.0.1.1", " no bgp ebgp-requires-policy",
                 " bgp bestpath as-path multipath-relax", " timers bgp 1 3", " coalesce-time 50",
                 " neighbor 10.0.1.2 remote-as 65001", " neighbor 10.0.1.2 timers 1 3",
                 " neighbor 10.0.1.2 timers connect 1",
                 " neighbor 10.0.1.2 advertisement-interval 0",
                 " neighbor 10.0.2.2 bfd", " neighbor 10.0.2.2 bfd profile fabriclab",
                 "  network 192.0.2.0/24", "  maximum-paths 4",
                 "  neighbor 10.0.1.6 activate",
                 # not transit: ISP routes are not passed on to the other ISP
                 "ip prefix-list FL-OWN seq 5 permit 192.0.2.0/24",
                 "  neighbor 10.0.1.2 route-map FL-OWN-OUT out"]:
        assert want in lines, want
    assert " neighbor 10.0.1.2 bfd" not in lines
    isp2 = edge().configs("isp2")["bgpd.conf"].splitlines()
    assert " bgp bestpath as-path multipath-relax" not in isp2
    assert not any("maximum-paths" in x for x in isp2)     # 1 is FRR's default
    assert not any("route-map" in x for x in isp2)          # transit by default


def test_zebra_and_bfdd_conf():
    confs = edge().configs("border1")
    zebra = confs["zebra.conf"].splitlines()
    assert "interface border1-eth2" in zebra
    assert " description to isp2 (isp2-eth0)" in zebra
    bfdd = confs["bfdd.conf"].splitlines()
    assert " profile fabriclab" in bfdd and "  transmit-interval 100" in bfdd
    assert "  detect-multiplier 3" in bfdd
    assert "bfdd.conf" not in edge().configs("isp1")        # no BFD session: no bfdd


@needs_vtysh
@pytest.mark.parametrize("router", ["border1", "isp1", "isp2"])
def test_frr_parses_every_generated_config(router):
    from lab.net.frr import check_config
    for fname, text in edge().configs(router).items():
        check_config(text, f"{router}/{fname}")


@needs_vtysh
def test_frr_parser_check_catches_a_bad_line():
    from lab.net.frr import check_config
    with pytest.raises(TopologyError, match="Unknown command"):
        check_config("router bgp 65000\n no such command here\n", "x")
