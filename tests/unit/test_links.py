"""Link layout (tc commands), netem parameters and their refusals, without building anything."""

from __future__ import annotations

import itertools
import math

import pytest

from lab.kinds.streaming.metrics import wan_fidelity
from lab.model.errors import MachineError, TopologyError
from lab.net.edge import DEFAULT_WAN_DELAY_MS
from lab.net.links import (
    MAX_TSO_FRAMES,
    TSO_LIMIT,
    Netem,
    check_netem,
    netem_limit_packets,
    root_netem_delay_ms,
    tc_commands,
    wire_qdiscs,
)
from lab.net.topobase import refuse_without_netem
from lab.net.topologies import describe, make_topology

FIELDS = ("t.delay_ms", "t.jitter_ms", "t.loss_pct")


def test_without_netem_the_layout_is_htb_root_with_a_byte_fifo_leaf():
    cmds = tc_commands("s1-eth1", 50.0, 100_000)
    assert cmds[0] == "tc qdisc add dev s1-eth1 root handle 1: htb default 1"
    assert cmds[1].startswith("tc class add dev s1-eth1 parent 1: classid 1:1 htb rate 50.0mbit")
    assert cmds[2] == "tc qdisc add dev s1-eth1 parent 1:1 handle 10: bfifo limit 100000"
    assert len(cmds) == 3
    assert tc_commands("s1-eth1", 50.0, 100_000, Netem()) == cmds   # nothing asked: same


def test_netem_goes_to_the_root_and_the_byte_queue_stays_the_leaf():
    cmds = tc_commands("s1-eth1", 100.0, 80_000, Netem(10, 2, 0.5))
    assert cmds[0].startswith("tc qdisc add dev s1-eth1 root handle 2: netem limit ")
    assert cmds[0].endswith(" delay 10ms 2ms loss 0.5%")
    # htb under netem keeps handle 1: and class 1:1 (the streaming kind changes its rate),
    # and the leaf 10: keeps the configured BYTE limit (the ECN marker replaces it).
    assert cmds[1] == "tc qdisc add dev s1-eth1 parent 2:1 handle 1: htb default 1"
    assert cmds[2].startswith("tc class add dev s1-eth1 parent 1: classid 1:1 htb rate 100.0mbit")
    assert cmds[3] == "tc qdisc add dev s1-eth1 parent 1:1 handle 10: bfifo limit 80000"
    assert not any("limit 53" in c for c in cmds)     # no packet limit derived from bytes


@pytest.mark.parametrize("netem, args", [
    (Netem(delay_ms=1), "delay 1ms"),
    (Netem(delay_ms=0.25, jitter_ms=0.1), "delay 0.25ms 0.1ms"),
    (Netem(loss_pct=1), "loss 1%"),
])
def test_netem_arguments(netem, args):
    assert netem.active and netem.args() == args


def test_netem_time_line_holds_a_fan_in_of_the_link_rate_for_the_delay():
    assert netem_limit_packets(100.0, Netem(delay_ms=1)) == 1000          # netem's default
    # 16 x 12.5 MB/s x 20 ms / 1500 B
    assert netem_limit_packets(100.0, Netem(delay_ms=20)) == math.ceil(16 * 12.5e6 * 0.02 / 1500)
    assert netem_limit_packets(100.0, Netem(delay_ms=20, jitter_ms=20)) > \
        netem_limit_packets(100.0, Netem(delay_ms=20))


@pytest.mark.parametrize("values, field", [
    ({"delay_ms": -1}, "t.delay_ms"),
    ({"delay_ms": "5ms"}, "t.delay_ms"),
    ({"delay_ms": True}, "t.delay_ms"),
    ({"delay_ms": float("nan")}, "t.delay_ms"),
    ({"delay_ms": 5000}, "t.delay_ms"),
    ({"jitter_ms": None}, "t.jitter_ms"),
    ({"delay_ms": 1, "jitter_ms": 2}, "t.jitter_ms"),
    ({"loss_pct": 100}, "t.loss_pct"),
    ({"loss_pct": -0.1}, "t.loss_pct"),
])
def test_bad_netem_values_are_refused_naming_the_field(values, field):
    with pytest.raises(TopologyError) as exc:
        check_netem(FIELDS, **values)
    assert exc.value.field == field
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("spec, field", [
    ({"type": "leafspine", "link_delay_ms": -2}, "topology.link_delay_ms"),
    ({"type": "fattree", "link_jitter_ms": 1}, "topology.link_jitter_ms"),
    ({"type": "fattree", "link_loss_pct": "lots"}, "topology.link_loss_pct"),
    ({"type": "streaming-edge", "wan_delay_ms": -10}, "topology.wan_delay_ms"),
])
def test_bad_link_netem_in_a_topology_is_refused_naming_the_field(spec, field):
    with pytest.raises(TopologyError) as exc:
        make_topology(spec)
    assert exc.value.field == field


def test_link_delay_is_on_fabric_links_only_and_recorded():
    d = describe(make_topology({"type": "leafspine", "link_delay_ms": 2, "link_loss_pct": 0.1}))
    assert d["params"]["link_delay_ms"] == 2.0 and d["params"]["link_loss_pct"] == 0.1
    hosts = {h["name"] for h in d["hosts"]}
    for ln in d["links"]:
        host_link = ln["a"] in hosts or ln["b"] in hosts
        assert ln["delay_ms"] == (0.0 if host_link else 2.0), ln


def test_default_topologies_ask_for_no_netem():
    for spec in ({"type": "leafspine"}, {"type": "fattree"}):
        d = describe(make_topology(spec))
        assert {ln["delay_ms"] for ln in d["links"]} == {0.0}
        refuse_without_netem(d, netem=False)          # nothing asked: nothing refused


def test_without_netem_a_delay_is_refused_before_anything_starts():
    d = describe(make_topology({"type": "fattree", "link_loss_pct": 0.5}))
    with pytest.raises(MachineError) as exc:
        refuse_without_netem(d, netem=False)
    assert exc.value.field == "topology.link_loss_pct" and "netem" in exc.value.message
    refuse_without_netem(d, netem=True)


def test_streaming_edge_asks_for_wan_delay_on_uplinks_only():
    d = describe(make_topology({"type": "streaming-edge"}))
    assert d["params"]["wan_delay_ms"] == DEFAULT_WAN_DELAY_MS
    by_role = {}
    for ln in d["router_links"]:
        by_role.setdefault(ln["role"], set()).add(ln["wan_delay_ms"])
    assert by_role["uplink"] == {DEFAULT_WAN_DELAY_MS}
    assert by_role["core"] == {0.0} and by_role["access"] == {0.0}
    # WAN delay is applied where netem exists, so it is never refused up front
    refuse_without_netem(d, netem=False)


def test_root_netem_delay_is_read_back_from_tc_json():
    netem = [{"kind": "netem", "handle": "2:", "root": True,
              "options": {"limit": 1000, "delay": {"delay": 0.01, "jitter": 0,
                                                   "correlation": 0}}},
             {"kind": "htb", "handle": "1:", "parent": "2:1"}]
    assert root_netem_delay_ms(netem) == pytest.approx(10.0)
    assert root_netem_delay_ms([{"kind": "htb", "handle": "1:", "root": True}]) is None
    assert root_netem_delay_ms([{"kind": "netem", "root": True, "options": {"limit": 1000}}]) \
        is None


def test_wan_fidelity_says_what_the_uplinks_got():
    fid, note = wan_fidelity(10.0, {"a->b": 10.0, "b->a": 10.0})
    assert fid["wan_delay"] == "netem" and fid["wan_delay_ms"] == [10.0] and note is None
    fid, note = wan_fidelity(10.0, {"a->b": None, "b->a": None})
    assert fid["wan_delay"] == "none (no netem)" and "no netem" in note
    fid, note = wan_fidelity(10.0, {"a->b": 10.0, "b->a": None})
    assert fid["wan_delay"] == "partial" and "b->a" in note
    fid, note = wan_fidelity(0.0, {"a->b": None})
    assert fid["wan_delay"] == "none (not asked)" and note is None


def test_the_byte_queue_handle_is_read_as_tc_writes_it():
    """tc's handles are hexadecimal: the leaf "10:" the links create is 0x00100000 in a
    netlink dump. Read as decimal (0x000A0000), telemetry never found the leaf and reported
    a root netem's delay line as the port's queue."""
    from controllers.marking import QUEUE_HANDLE, tc_major
    from lab.measure import netlink
    assert tc_major("10:") == 0x0010_0000 and tc_major("1:") == 0x0001_0000
    assert tc_major(QUEUE_HANDLE) == netlink.BYTE_QUEUE_HANDLE
    cmds = tc_commands("eth0", 10.0, 20_000)
    assert any(f"handle {QUEUE_HANDLE} bfifo" in c for c in cmds), cmds


def test_the_wire_size_table_counts_every_frame():
    """A frame costs its bytes + 24 (preamble, gap, FCS), at least 84; a TCP TSO packet is
    its segments, each with the 66 bytes of headers again."""
    from controllers.marking import (
        TCP_FRAME_HEADER_BYTES,
        TCP_MSS_BYTES,
        WIRE_TABLE_SLOTS,
        wire_bytes,
        wire_size_table,
    )
    assert wire_bytes(42) == 84 and wire_bytes(66) == 90 and wire_bytes(1514) == 1538
    for segs in range(1, 6):
        skb = TCP_FRAME_HEADER_BYTES + segs * TCP_MSS_BYTES
        assert wire_bytes(skb) == segs * 1538
        assert wire_bytes(skb - 100) == segs * 1538 - 100        # a short last segment
    table = wire_size_table()
    assert len(table) == WIRE_TABLE_SLOTS and max(table) < 2**16       # tc's u16 slots
    assert wire_bytes(TCP_FRAME_HEADER_BYTES + MAX_TSO_FRAMES * TCP_MSS_BYTES) < len(table)
    assert all(b > a for a, b in itertools.pairwise(table[84:]))


def test_every_port_caps_its_tso_packets():
    assert f"gso_max_segs {MAX_TSO_FRAMES}" == TSO_LIMIT
    # the htb counts wire bytes; below a netem, the netem at the root too
    assert [(q.parent, q.handle, q.kind) for q in wire_qdiscs("p", Netem())] == [
        (0xFFFFFFFF, 0x00010000, "htb")]
    assert [(q.parent, q.handle, q.kind) for q in wire_qdiscs("p", Netem(delay_ms=1.0))] == [
        (0xFFFFFFFF, 0x00020000, "netem"), (0x00020001, 0x00010000, "htb")]


def test_programs_get_longer_to_start_under_tcg(monkeypatch):
    """Eight gloo ranks importing torch took 75 s in the TCG guest: the ready guard there
    is TCG_READY_FACTOR times the host's."""
    from lab.machine import programs
    monkeypatch.setattr(programs, "guest_vm", lambda: None)
    assert programs.ready_timeout_s() == programs.READY_TIMEOUT_S
    monkeypatch.setattr(programs, "guest_vm", lambda: {"accelerator": "kvm"})
    assert programs.ready_timeout_s() == programs.READY_TIMEOUT_S
    monkeypatch.setattr(programs, "guest_vm", lambda: {"accelerator": "tcg"})
    assert programs.ready_timeout_s() == programs.READY_TIMEOUT_S * programs.TCG_READY_FACTOR > 75
