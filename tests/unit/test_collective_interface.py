"""A collective bound to the hosts' management NICs: an interface the topology does not have
is one error naming ``job.interface`` before anything starts; with one, the ring's
connections are planned on the management addresses and its storage reads stay on the
fabric's."""

from __future__ import annotations

import ipaddress

import pytest

from lab import run
from lab.model.errors import ScenarioError


@pytest.mark.parametrize("sets, field, words", [
    # gpu-wait's own topology has no management network without topology.mgmt_bw
    (["topology.mgmt_bw=0", "phases.healthy.job.interface=mgmt"],
     "phases.healthy.job.interface", "no management network"),
    (["job.interface=eth9"], "job.interface", "eth9"),
    (["topology.mgmt_bw=5", "phases.healthy.job.interface=mgmt",
      "phases.healthy.job.library=gloo",
      "phases.healthy.loader.enabled=false"], "phases.healthy.job.interface", "gloo"),
])
def test_an_interface_that_is_not_there_is_refused(sets: list[str], field: str,
                                                   words: str) -> None:
    with pytest.raises(ScenarioError) as err:
        run.make_plans("gpu-wait", sets=sets)
    assert err.value.field == field, str(err.value)
    assert words in str(err.value)


def test_the_management_network_is_described_with_its_own_addresses() -> None:
    """Every host has a management address, each its own, all in the management subnet
    and none in the fabric's: a connection's addresses alone say which network it used.
    Each host's management link (its own interface and MAC) runs at the rate set."""
    plan = run.make_plans("gpu-wait", sets=["topology.mgmt_bw=5"])[0]
    mgmt = plan.topo_desc["mgmt"]
    fabric = {h["name"]: h["ip"] for h in plan.topo_desc["hosts"]}
    assert {h["name"] for h in mgmt["hosts"]} == set(fabric)
    subnet = ipaddress.ip_network(mgmt["subnet"])
    ips = [ipaddress.ip_address(h["ip"]) for h in mgmt["hosts"]]
    assert len(set(ips)) == len(ips) and all(ip in subnet for ip in ips)
    assert not any(ipaddress.ip_address(ip) in subnet for ip in fabric.values())
    assert len({h["mac"] for h in mgmt["hosts"]}) == len(mgmt["hosts"])
    fabric_macs = {h["mac"] for h in plan.topo_desc["hosts"]}
    assert not {h["mac"] for h in mgmt["hosts"]} & fabric_macs
    assert {ln["a"] for ln in mgmt["links"]} == set(fabric)
    assert {ln["bw_mbps"] for ln in mgmt["links"]} == {5.0} and mgmt["bw_mbps"] == 5.0
