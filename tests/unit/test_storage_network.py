"""A storage network of its own (``storage.network: mgmt``), without a network: its bad
input, one error naming the key; its connections planned on the management addresses at
both ends; its slow links on the management LAN; the diagnosis reading which network the
loaders used from their flows alone."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from lab import run
from lab.analysis import gpuwait as diagnosis
from lab.kinds.collective import plan as kind
from lab.kinds.collective.programs import JobPrograms, loader_args
from lab.kinds.collective.readout import JobReadout
from lab.kinds.collective.scheduler import scheduler_map
from lab.kinds.collective.setup import JobSetup
from lab.measure import telemetry
from lab.model.errors import ScenarioError
from lab.net.topologies import describe, make_topology

TOPO = {"type": "leafspine", "spines": 2, "leaves": 3, "hosts_per_leaf": 4, "host_bw": 50,
        "mgmt_bw": 10}
STORAGE = ["h11", "h12"]


@pytest.mark.parametrize("sets, field, words", [
    # gpu-wait's topology without its management LAN
    (["topology.mgmt_bw=0", "phases.data.storage.network=mgmt"],
     "phases.data.storage.network", "no management network"),
    (["storage.network=mgmt", "topology.mgmt_bw=0"], "storage.network",
     "no management network"),
    # nothing to put on it without a loader
    (["phases.healthy.storage.network=mgmt", "phases.healthy.loader.enabled=false"],
     "phases.healthy.storage.network", "no loader"),
    # NIC classes share the fabric NIC between the ring and storage
    (["phases.healthy.storage.network=mgmt", "phases.healthy.storage.mode=classes"],
     "phases.healthy.storage.network", "classes"),
    (["storage.network=san"], "storage.network", "san"),
    (["phases.cpu.storage.network=1"], "phases.cpu.storage.network", "expected str"),
])
def test_bad_storage_network_names_the_field(sets: list[str], field: str,
                                             words: str) -> None:
    with pytest.raises(ScenarioError) as err:
        run.make_plans("gpu-wait", sets=sets)
    assert err.value.field == field, str(err.value)
    assert words in str(err.value)


def topo() -> dict:
    return describe(make_topology(TOPO))


def planned(network: str, mode: str = "off") -> tuple[dict, dict, list, list, list]:
    """A phase's ring, storage and loader connections as ``JobSetup`` plans them."""
    t = topo()
    pp = kind.check({"job": {"workers": 4, "size_bytes": 4 * 1024},
                     "storage": {"hosts": STORAGE, "network": network, "mode": mode},
                     "loader": {"enabled": True, "workers": 2}}, t)["run"]
    setup = JobSetup()
    setup.topo = t
    setup.ips = {h["name"]: h["ip"] for h in t["hosts"]}
    setup.sports = random.Random(1).sample(range(20000, 32000), 200)
    setup.next_index = 0
    hosts = kind.place_workers(t, pp, random.Random(1))
    return (pp, t, setup.conns_for(pp, hosts), setup.storage_conns(pp, hosts),
            setup.loader_conns(pp, hosts))


def test_separate_storage_is_planned_on_the_management_addresses() -> None:
    """Both ends of every loader connection and storage client are the hosts' management
    addresses; the ring stays on the fabric's, and a rank's loader binds its own."""
    pp, t, ring, sconns, lconns = planned("mgmt", mode="shared")
    mgmt = {h["name"]: h["ip"] for h in t["mgmt"]["hosts"]}
    fabric = {h["name"]: h["ip"] for h in t["hosts"]}
    assert lconns and sconns
    for c in lconns + sconns:
        assert (c.spec.src_ip, c.spec.dst_ip) == (mgmt[c.spec.src], mgmt[c.spec.dst]), c.spec
    assert all(c.spec.src_ip == fabric[c.spec.src] for c in ring)
    for r in range(4):
        mine = [c for c in lconns if c.rank == r]
        opts = dict(zip(*[iter(loader_args(pp, mine))] * 2, strict=True))
        assert opts["--loader-bind"] == mgmt[mine[0].spec.dst]
        assert all(a.split(":")[0] in {mgmt[s] for s in STORAGE}
                   for a in opts["--storage"].split(","))


def test_storage_on_the_fabric_is_planned_as_before() -> None:
    _, t, _, _, lconns = planned("fabric")
    fabric = {h["name"]: h["ip"] for h in t["hosts"]}
    assert all((c.spec.src_ip, c.spec.dst_ip) == (fabric[c.spec.src], fabric[c.spec.dst])
               for c in lconns)


@pytest.mark.parametrize("network", ["fabric", "mgmt"])
def test_a_slow_storage_link_is_on_the_storage_network(network: str) -> None:
    """The ports facing the storage hosts report ``storage.link_mbps`` on the storage
    network only; the management LAN's ports are measured when storage uses it."""
    t = topo()
    progs = JobPrograms()
    progs.plan = SimpleNamespace(topo_desc=t)
    progs.ports = telemetry.fabric_ports(t)
    pp = kind.check({"storage": {"hosts": STORAGE, "network": network, "link_mbps": 0.5},
                     "loader": {"enabled": True}}, t)["run"]
    ports = progs.phase_ports(pp)
    facing = {(p.role, p.peer): p.bw_mbps for p in ports if p.peer in STORAGE}
    for h in STORAGE:
        assert facing[(network, h)] == 0.5
        if network == "mgmt":
            assert facing[("fabric", h)] == 50.0         # the fabric's as built
        else:
            assert ("mgmt", h) not in facing             # the LAN is not measured
    assert any(p.role == "mgmt" for p in ports) == (network == "mgmt")


def test_a_loader_connection_carries_what_its_rank_received() -> None:
    """Each loader flow gets the bytes the rank's end of its connection received (TCP_INFO),
    matched by the 5-tuple seen from the rank."""
    _, _, _, _, lconns = planned("mgmt")
    outputs = [{"loader": {"per_worker": [
        {"src": c.spec.dst_ip, "sport": c.spec.dport, "bytes_received": 1000 * (i + 1)}
        for i, c in enumerate(lconns) if c.rank == r]}} for r in range(4)]
    JobReadout.attach_loader_results(lconns, outputs)
    got = sorted(c.spec.result["received_bytes"] for c in lconns)
    assert got == sorted(1000 * (i + 1) for r in range(4)
                         for i, c in enumerate(lconns) if c.rank == r)


def test_a_storage_clients_connections_carry_what_it_counted(tmp_path) -> None:
    """A storage client's read connection received its ``read_bytes``; its checkpoint
    connection sent its checkpoints' acknowledged bytes."""
    _, _, _, sconns, _ = planned("mgmt", mode="shared")
    for r in range(4):
        (tmp_path / f"client{r}.json").write_text(json.dumps(
            {"read_bytes": 1000 + r, "checkpoints": [{"bytes": 200}, {"bytes": 50 * r}]}))
    JobReadout.attach_client_results(sconns, tmp_path)
    for c in sconns:
        key, want = (("received_bytes", 1000 + c.rank) if c.spec.kind == "storage-read"
                     else ("sent_bytes", 200 + 50 * c.rank))
        assert c.spec.result[key] == want, (c.spec.id, c.spec.result)


def loader_flow(src: str, dst: str, interface: str, nbytes: int, received: int) -> dict:
    path = ["mgmt1"] if interface == "mgmt" else ["leaf3", "spine1", "leaf1"]
    return {"src": src, "dst": dst, "interface": interface, "path": path,
            "bytes": nbytes, "received_bytes": received, "sent_bytes": 0}


def link(node: str, peer: str, bw: float, drops: int, role: str = "fabric") -> dict:
    return {"node": node, "peer": peer, "intf": f"{node}-eth{peer[1:]}", "bw_mbps": bw,
            "drops": drops, **({"role": role} if role != "fabric" else {})}


def test_the_diagnosis_reads_the_storage_link_of_the_network_the_loaders_used() -> None:
    """Off the fabric a loader flow's bytes are its ends' count and its storage link is the
    management LAN's port facing the host (its rate and drops), not the fabric's."""
    links = [link("leaf3", "h11", 50.0, 0), link("mgmt1", "h11", 0.5, 3, role="mgmt")]
    mgmt = {"duration_s": 8.0, "links": links,
            "flows": [loader_flow("h11", "h1", "mgmt", 0, 400_000),
                      loader_flow("h11", "h2", "mgmt", 0, 100_000)],
            "scheduler": scheduler_map(["h1", "h2"], [], ["h11"])}
    (s,) = diagnosis.storage_links(mgmt)
    assert s == {"host": "h11", "network": "mgmt", "port": "mgmt1-eth11", "bytes": 500_000,
                 "bw_mbps": 0.5, "util": 1.0, "drops": 3}
    fabric = {**mgmt, "flows": [loader_flow("h11", "h1", "fabric", 250_000, 240_000)]}
    (s,) = diagnosis.storage_links(fabric)
    assert (s["network"], s["port"], s["bytes"], s["bw_mbps"], s["util"]) == \
        ("fabric", "leaf3-eth11", 250_000, 50.0, 0.005)
