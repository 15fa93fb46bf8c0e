"""least-loaded and flowlet: the state they keep, and what the controller installs for them."""

from __future__ import annotations

from controllers import plan, policies
from controllers.policies import FlowKey


def flow(sport: int) -> FlowKey:
    return FlowKey("10.0.0.1", "10.0.0.5", 6, sport, 5201)


def test_least_loaded_follows_measured_load() -> None:
    pol = policies.get("least-loaded")(seed=1)
    pol.observe_ports("leaf1", {1: 90e6, 2: 10e6, 3: 50e6})
    assert all(pol.choose(flow(s), "leaf1", [1, 2, 3]) == 2 for s in range(40000, 40050))
    # Another switch has measurements of its own.
    pol.observe_ports("leaf2", {1: 0.0, 2: 80e6})
    assert pol.choose(flow(1), "leaf2", [1, 2]) == 1


def test_least_loaded_counts_what_it_placed_since_the_last_measurement() -> None:
    """Flows that arrive together must not all pile onto the port that looked idle."""
    pol = policies.get("least-loaded")(seed=1)
    counts = {1: 0, 2: 0, 3: 0, 4: 0}
    for s in range(40000, 40008):
        port = pol.choose(flow(s), "leaf1", [1, 2, 3, 4])
        pol.placed(flow(s), "leaf1", port, None)
        counts[port] += 1
    assert counts == {1: 2, 2: 2, 3: 2, 4: 2}
    pol.observe_ports("leaf1", {1: 0.0, 2: 0.0, 3: 0.0, 4: 30e6})   # resets the estimate
    assert pol.load("leaf1", 1) == 0.0 and pol.load("leaf1", 4) == 30e6


def test_least_loaded_breaks_ties_by_hash_not_by_port_order() -> None:
    pol = policies.get("least-loaded")(seed=3)
    assert {pol.choose(flow(s), "leaf1", [1, 2, 3, 4]) for s in range(40000, 40100)} == \
        {1, 2, 3, 4}
    assert policies.get("least-loaded").port_stats_interval > 0


def test_flowlet_keeps_a_burst_together_and_may_move_after_a_gap() -> None:
    pol = policies.get("flowlet")(seed=2)
    f = flow(40001)
    assert pol.flowlet_of(f, "leaf1", now=10.0) == 0
    assert pol.flowlet_of(f, "leaf1", now=10.5) == 0           # same burst
    assert pol.flowlet_of(f, "leaf1", now=12.0) == 1           # after an idle >= 1 s
    assert pol.flowlet_of(f, "spine1", now=12.0) == 0          # per switch
    # Over many flowlets of one flow, every port gets used: a flowlet may move.
    ports = set()
    for i in range(64):
        pol.flowlet_of(f, "leaf9", now=100.0 + 2 * i)
        number = pol._flowlet[("leaf9", f)][0]
        data = policies.base.pack_5tuple(f) + number.to_bytes(4, "big")
        ports.add(policies.base.pick([1, 2, 3, 4], policies.base.seeded_crc(data, 2)))
    assert ports == {1, 2, 3, 4}


def test_reactive_entries_take_the_policy_idle_timeout() -> None:
    key = flow(40001)
    assert plan.reactive_entry(key, 2).idle_timeout == plan.FLOW_IDLE_TIMEOUT
    timeout = policies.get("flowlet").idle_timeout
    assert timeout == 1
    assert plan.reactive_entry(key, 2, timeout).idle_timeout == 1
    assert policies.get("hash5").idle_timeout is None


def test_least_loaded_repeats_its_decision_for_a_flow_and_counts_it_once() -> None:
    """Packets of one flow that reach the controller before its entry must not split it."""
    pol = policies.get("least-loaded")(seed=1)
    first = pol.choose(flow(40001), "leaf1", [1, 2])
    pol.placed(flow(40001), "leaf1", first, None)
    for _ in range(3):
        assert pol.choose(flow(40001), "leaf1", [1, 2]) == first
        pol.placed(flow(40001), "leaf1", first, None)
    assert pol.load("leaf1", first) == pol.new_flow_bps
