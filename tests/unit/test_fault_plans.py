"""Faults as data (lab.workloads.faults) and the controller's reroute arithmetic (controllers.plan).

No root, no packets: the parsing a bad scenario meets, the outage arithmetic on receiver
intervals, and the make-before-break changes a reroute sends.
"""

import pytest

from controllers import plan, routing
from controllers.config import build as controller_config
from controllers.policies import resolve
from lab.model.errors import ScenarioError
from lab.net.topologies import describe, make_topology
from lab.workloads import faults

LEAFSPINE = describe(make_topology({"type": "leafspine", "spines": 4, "leaves": 2,
                                    "hosts_per_leaf": 2}))


def parse(items, duration=9.0):
    return faults.parse(items, LEAFSPINE, duration)


def test_each_kind_of_fault_and_its_timeline():
    link, dark, flap, ctl = parse([
        {"at": 1.5, "link": "leaf2-spine1"},
        {"at": 3.5, "switch": "spine2", "for": 1.5},
        {"at": 6, "link": "spine3-leaf1", "flap": 2, "every": 0.3},
        {"at": 2, "controller": "kill", "for": 2}])
    assert link.actions() == [(1.5, "down")]                 # stays down
    assert sorted(link.intfs) == sorted(faults.link_intfs(LEAFSPINE)["leaf2-spine1"])
    assert len(link.intfs) == 2
    # a dark spine: both ends of each of its 2 links
    assert len(dark.intfs) == 4 and all(i.startswith(("spine2-", "leaf")) for i in dark.intfs)
    assert dark.actions() == [(3.5, "down"), (5.0, "up")]
    assert [a for _, a in flap.actions()] == ["down", "up", "down", "up"]
    assert flap.actions()[-1][0] == pytest.approx(6.9)
    assert ctl.actions() == [(2, "kill"), (4, "restart")] and ctl.intfs == ()
    assert parse(None) == [] and parse([]) == []


@pytest.mark.parametrize("items, field, words", [
    ("x", "faults", "list"),
    ([3], "faults[0]", "mapping"),
    ([{"at": 1}], "faults[0]", "exactly one"),
    ([{"at": 1, "link": "leaf1-spine1", "switch": "spine1"}], "faults[0]", "exactly one"),
    ([{"link": "leaf1-spine1"}], "faults[0].at", "missing"),
    ([{"at": "soon", "link": "leaf1-spine1"}], "faults[0].at", "number"),
    ([{"at": True, "link": "leaf1-spine1"}], "faults[0].at", "number"),
    ([{"at": -1, "link": "leaf1-spine1"}], "faults[0].at", "0..9"),
    ([{"at": 1, "link": "leaf1-spine9"}], "faults[0].link", "no switch link"),
    ([{"at": 1, "link": "h1-leaf1"}], "faults[0].link", "no switch link"),
    ([{"at": 1, "switch": "spine7"}], "faults[0].switch", "no switch"),
    ([{"at": 1, "controller": "reboot", "for": 1}], "faults[0].controller", "kill"),
    ([{"at": 1, "controller": "kill"}], "faults[0].for", "missing"),
    ([{"at": 1, "controller": "kill", "flap": 2, "every": 1}], "faults[0].flap", "flap"),
    ([{"at": 1, "link": "leaf1-spine1", "flap": 0, "every": 1}], "faults[0].flap", "1..100"),
    ([{"at": 1, "link": "leaf1-spine1", "flap": 2}], "faults[0].every", "missing"),
    ([{"at": 1, "link": "leaf1-spine1", "flap": 2, "every": 1, "for": 1}], "faults[0].for",
     "flap"),
    ([{"at": 8, "link": "leaf1-spine1", "for": 2}], "faults[0].for", "within"),
    ([{"at": 8, "link": "leaf1-spine1", "flap": 3, "every": 0.5}], "faults[0].every",
     "within"),
    ([{"at": 1, "link": "leaf1-spine1", "when": 2}], "faults[0].when", "unknown key"),
])
def test_bad_faults_name_their_field(items, field, words):
    with pytest.raises(ScenarioError) as exc:
        parse(items)
    assert exc.value.field == field
    assert words in str(exc.value)


def test_outage_is_read_from_receiver_intervals():
    rate = 10e6                                 # 125 kB per 0.1 s at full rate
    full, none = 125_000, 0
    ivs = [(i / 10, (i + 1) / 10, full) for i in range(20)]
    ivs[12] = (1.2, 1.3, none)
    ivs[13] = (1.3, 1.4, 10_000)                # 0.8 Mbit/s: under a tenth of 10 Mbit/s
    ivs[15] = (1.5, 1.6, none)
    got = faults.flow_outage(ivs, rate, t_from=1.0, t_end=2.0)
    assert got == {"out_s": pytest.approx(0.3), "longest_out_s": pytest.approx(0.2),
                   "black_holed": False}
    # nothing in the last second: black-holed; outages before the first fault do not count
    dead = [(s, e, full if e <= 1.0 else 0) for s, e, _ in ivs]
    dead[3] = (0.3, 0.4, 0)
    got = faults.flow_outage(dead, rate, t_from=1.0, t_end=2.0)
    assert got["black_holed"] and got["out_s"] == pytest.approx(1.0)


def _plans(down: set[int]):
    cfg = controller_config(LEAFSPINE, "hash5", 1)
    topo = {k: cfg[k] for k in ("switches", "hosts", "links")}
    return topo, routing.ecmp_routes(plan.topology_without(topo, down))


def test_a_reroute_is_make_before_break_and_never_reuses_a_group_id():
    policy = resolve("ovs-select")(seed=1)
    topo, before_routes = _plans(set())
    dead = next(i for i, ln in enumerate(topo["links"])
                if {ln["a"], ln["b"]} == {"leaf2", "spine1"})
    _, after_routes = _plans({dead})
    old = plan.switch_plan("leaf1", before_routes["leaf1"], topo["hosts"], policy)
    new = plan.renumber_groups(old.groups, plan.switch_plan(
        "leaf1", after_routes["leaf1"], topo["hosts"], policy))
    ch = plan.plan_changes(old, new)
    # leaf1 no longer sends leaf2's hosts via spine1: a new group of 3 spines, a new id
    assert [len(g.ports) for g in ch.groups_add] == [3]
    assert ch.groups_add[0].group_id > max(g.group_id for g in old.groups)
    assert len(ch.flows_add) == 2 and not ch.flows_delete     # leaf2's 2 hosts, replaced
    assert ch.groups_delete == old.groups                     # nothing points at it now
    # back to the start: the 4-spine set comes back under yet another id, no gap
    again = plan.renumber_groups(new.groups, old)
    back = plan.plan_changes(new, again)
    assert back.groups_add[0].ports == old.groups[0].ports
    assert back.groups_add[0].group_id > ch.groups_add[0].group_id
    assert plan.plan_changes(again, again).empty


def test_reconciliation_keeps_what_matches_whatever_the_field_order():
    policy = resolve("hash5")(seed=1)
    topo, routes = _plans(set())
    wanted = plan.switch_plan("leaf1", routes["leaf1"], topo["hosts"], policy)
    found = plan.SwitchPlan(wanted.groups, tuple(
        plan.FlowEntry(e.table, e.priority, tuple(reversed(e.match)), e.action, e.cookie,
                       e.idle_timeout) for e in wanted.flows))
    assert plan.plan_changes(found, wanted).empty
    stale = plan.FlowEntry(1, 5, (("eth_type", 0x800), ("ipv4_dst", "10.9.9.9")),
                           plan.Action("other"))
    ch = plan.plan_changes(plan.SwitchPlan(found.groups, (*found.flows, stale)), wanted)
    assert ch.flows_delete == (stale,) and not ch.flows_add


def test_a_counter_entry_read_back_is_the_watch_it_stands_for():
    w = plan.Watch(0xFAB0, plan.FlowKey("10.0.0.1", "10.0.0.3", 6, 40000, 5201))
    entry = plan.watch_entry(w)
    shuffled = plan.FlowEntry(entry.table, entry.priority, tuple(reversed(entry.match)),
                              entry.action, entry.cookie)
    assert plan.watch_of(shuffled) == w
    assert plan.watch_of(plan.FlowEntry(0, 0, (), plan.Action("goto", 1))) is None
