"""The roce kind without a network: its checks name the key, its ports and feeders follow the
topology, the pause tree and the regression metrics read what pfcd and the transport say."""

from __future__ import annotations

import json

import pytest

from controllers.classes import LOSSLESS_CLASS, LOSSY_CLASS, TrafficClasses
from lab import run
from lab.analysis import pauses
from lab.kinds.roce.metrics import receiver_cpu
from lab.model import lossless
from lab.model.errors import ScenarioError
from lab.model.flows import ROCE_UDP_PORT
from lab.workloads import rocebw


@pytest.mark.parametrize("sets, field", [
    (["roce.mtu=2048"], "roce.mtu"),                           # larger than the links'
    (["roce.mtu=1000"], "roce.mtu"),                           # not a RoCE MTU
    (['phases.dcqcn.ecn.marking="off"'], "phases.dcqcn.roce.cc"),  # DCQCN, nothing marks
    (["pfc.xoff_bytes=150000"], "pfc.xoff_bytes"),  # XOFF at the queue's size
    (["pfc.xon_bytes=40000"], "pfc.xon_bytes"),     # XON above XOFF
    (["pfc.xoff_bytes=100000"], "pfc.xoff_bytes"),            # headroom too small above it
    (["classes.weight=1.0"], "classes.weight"),
    (["classes.host_bytes=100000"], "classes.host_bytes"),
    (["flows=[{group: a, from: [h99], to: h1}]"], "flows[0].from[0]"),
    (["flows=[{group: a, from: [h1], to: h1}]"], "flows[0].to"),
    (["flows=[{group: a, from: [h5], to: h1, start_s: 9}]"], "flows[0].start_s"),
    (["flows=[{group: a, from: [h5], to: h1, rate: 9}]"], "flows[0].rate"),
    (["flows=[{group: a, from: [h5], to: h1, transport: rdma}]"], "flows[0].transport"),
    (["flows=[{group: a, from: [h5], to: h1, transport: tcp, start_s: 1}]"],
     "flows[0].start_s"),
    (["baseline=nope"], "baseline"),
    (["pfc.priority=4"], "pfc.priority"),                      # no class on priority 4
    (["phases.alone.flows=[{group: a, from: [h2], to: h99}]"], "phases.alone.flows[0].to"),
    (["topology.link_delay_ms=1"], "topology.link_delay_ms"),
    (["roce.spray=0"], "roce.spray"),
    (["roce.spray=257"], "roce.spray"),                        # more than a port block
    (["roce.placement=sack"], "roce.placement"),
    (["roce.reorder_pkts=4096"], "roce.reorder_pkts"),           # beyond the ooo window
    (["flows=[{group: a, from: [h5], to: h1, load: 1.5}]"], "flows[0].load"),
    (["flows=[{group: a, from: [h5], to: h1, load: 0}]"], "flows[0].load"),
    # 20 hosts a leaf: more feeders of a port than pfcd's table holds
    (["topology.hosts_per_leaf=20", "classes.lossless_bytes=400000"],
     "phases.pfc.pfc.enabled"),
])
def test_bad_input_names_the_key(sets: list[str], field: str) -> None:
    with pytest.raises(ScenarioError) as err:
        run.check_input("pfc-hol", None, sets, None, None)
    assert err.value.field == field, str(err.value)


def test_the_scenario_plans_one_qp_per_sender_and_phase() -> None:
    given = run.check_input("pfc-hol", None, [], None, None)
    by_phase: dict[str, list[str]] = {}
    for f in given.flows:
        by_phase.setdefault(f.phase, []).append(f.flow.id)
        want = ("udp", ROCE_UDP_PORT) if f.transport == "roce" else ("tcp", f.flow.dport)
        assert (f.flow.proto, f.flow.dport) == want
    assert by_phase["alone"] == ["victim-h8"]
    assert sorted(by_phase["pfc"]) == ["bulk-h5", "incast-h5", "incast-h6", "incast-h7",
                                       "victim-h8"]
    tcp = [f.flow.dport for f in given.flows if f.transport == "tcp"]
    assert len(set(tcp)) == len(tcp) == 3       # its own iperf3 port in each phase
    assert len({f.flow.sport for f in given.flows}) == len(given.flows)


def test_a_sprayed_qp_gets_a_port_block_of_its_own_and_a_subflow_per_port() -> None:
    """roce.spray 8 in the dcqcn phase: each of its QPs sends from a block's first 8 ports,
    each port a watched subflow; no other flow's port falls in a sprayed QP's block."""
    given = run.check_input("pfc-hol", None, ["phases.dcqcn.roce.spray=8"], None, None)
    sprayed = [f for f in given.flows if f.spray > 1]
    assert {f.phase for f in sprayed} == {"dcqcn"} and len(sprayed) == 4
    blocks = set()
    for f in sprayed:
        ports = [s.sport for s in f.specs()]
        assert ports == list(range(f.flow.sport, f.flow.sport + 8))
        assert f.flow.sport % 256 == 0 and [s.id for s in f.subflows][:1] == [
            f"{f.flow.id}~1"]
        blocks.add(f.flow.sport)
    assert len(blocks) == 4
    others = [f.flow.sport for f in given.flows if f.spray == 1]
    assert not any(b <= p < b + 256 for b in blocks for p in others)


def test_a_groups_load_is_a_share_of_each_senders_link_and_subflows_offer_nothing() -> None:
    """multipath: 4 QPs at 0.8 of 50 Mbit/s (times the scenario's rate_scale); a sprayed
    QP's other ports are its subflows, whose rate is the QP's (a prediction splits it)."""
    given = run.check_input("multipath", None, [], None, None)
    scale = float(given.params["rate_scale"])
    hashed = [f for f in given.flows if f.phase == "hashed"]
    assert [f.flow.rate_bps for f in hashed] == [pytest.approx(0.8 * 50e6 * scale)] * 4
    sprayed = [f for f in given.flows if f.phase == "sprayed-ooo"]
    assert all(len(f.subflows) == 255 for f in sprayed)
    assert all(s.subflow_of == f.flow.id and s.rate_bps == 0.0
               for f in sprayed for s in f.subflows)


def test_every_switch_port_is_fed_by_the_links_whose_traffic_can_leave_by_it() -> None:
    topo = run.check_input("pfc-hol", None, [], None, None).topo_desc
    ports = {p["dev"]: p for p in lossless.watched_ports(topo)}
    assert len(ports) == 2 * (4 + 2) + 2 * 2
    to_h1 = ports["leaf1-eth1"]
    assert to_h1["peer"] == "h1"
    # h2..h4's NICs and both spines' ports towards leaf1 feed leaf1
    assert sorted(f["dev"] for f in to_h1["feeders"]) == [
        "h2-eth0", "h3-eth0", "h4-eth0", "spine1-eth1", "spine2-eth1"]
    # up-down routing: what comes down from a spine never goes up again, so a leaf's
    # uplink is fed by its hosts alone, and a spine's port by the other leaves' uplinks
    assert sorted(f["dev"] for f in ports["leaf1-eth5"]["feeders"]) == [
        "h1-eth0", "h2-eth0", "h3-eth0", "h4-eth0"]
    assert [f["dev"] for f in ports["spine1-eth1"]["feeders"]] == ["leaf2-eth5"]


def test_the_classes_put_roce_and_cnps_in_the_lossless_class() -> None:
    cmds = TrafficClasses(weight=0.4).tc_commands("p0", 50)
    assert f"classid {LOSSLESS_CLASS} htb rate 20.0mbit ceil 50mbit" in " ".join(cmds)
    assert f"classid {LOSSY_CLASS} htb rate 30.0mbit ceil 50mbit" in " ".join(cmds)
    assert sum("match ip tos 0x68 0xfc" in c or "match ip tos 0xc0 0xfc" in c
               for c in cmds) == 2


def _pfcd(ports: dict[str, tuple[int, int, int]]) -> dict:
    """pfcd's JSON for ports {dev: (pause frames sent, received, paused ns)}."""
    return {"ports": [{"ns": "-", "dev": d, "priorities": {"3": {
        "pause_frames_tx": tx, "pause_frames_rx": rx, "paused_ns": ns}}}
        for d, (tx, rx, ns) in ports.items()]}


def test_the_pause_tree_starts_at_the_port_that_was_never_paused() -> None:
    feeds = {"leaf1-eth1": ["spine1-eth1", "h2-eth0"], "spine1-eth1": ["leaf2-eth3"],
             "leaf2-eth3": ["h5-eth0"]}
    tree = pauses.pause_tree(_pfcd({
        "leaf1-eth1": (40, 0, 0), "spine1-eth1": (30, 40, 10**9),
        "leaf2-eth3": (20, 30, 2 * 10**9), "h5-eth0": (0, 20, 3 * 10**9),
        "h2-eth0": (0, 0, 0)}), feeds)
    assert tree["roots"] == ["leaf1-eth1"]
    assert tree["hops"] == {"leaf1-eth1": 0, "spine1-eth1": 1, "leaf2-eth3": 2, "h5-eth0": 3}
    assert tree["max_hops"] == 3
    assert "h2-eth0" not in tree["paused_ns"]
    assert pauses.pause_tree(None, feeds)["max_hops"] == 0


def test_jains_index_is_one_for_equal_shares_and_one_over_n_for_a_hog() -> None:
    from lab.kinds.roce import metrics
    assert metrics.jain([5.0, 5.0, 5.0, 5.0]) == 1.0
    assert metrics.jain([20.0, 0.0, 0.0, 0.0]) == 0.25
    assert round(metrics.jain([4.7, 5.5, 5.1, 8.8]) or 0, 3) == 0.932
    assert metrics.jain([]) is None and metrics.jain([0.0, 0.0]) is None


def test_a_receivers_cpu_is_its_servers_own_and_counted_once_per_host(tmp_path) -> None:
    """The server's rusage over its life, % of a core; a receiver with several QPs counts
    once in the phase's mean, and a server that left no JSON is no number."""
    assert rocebw.server_cpu_pct({}) is None
    given = run.check_input("pfc-hol", None, [], None, None)
    flows = [f for f in given.flows if f.phase == "pfc" and f.transport == "roce"]
    rx = {f.flow.dst for f in flows}
    assert len(rx) < len(flows)                   # several QPs into one receiver
    for h in rx:
        (tmp_path / f"server-{h}.json").write_text(json.dumps(
            {"elapsed_s": 5.0, "cpu": {"user_s": 0.3, "sys_s": 0.2}, "qps": []}))
    for f in flows:
        (tmp_path / f"{f.flow.id}.json").write_text(json.dumps({"qps": [{"qpn": 1}]}))
    outputs = rocebw.read_outputs([f.flow for f in flows], tmp_path)
    assert {o["receiver_cpu_pct"] for o in outputs.values()} == {10.0}
    assert receiver_cpu(flows, outputs) == 10.0
    assert receiver_cpu(flows, {}) is None
