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


# -- adaptive: a flow moved off a port whose queue stays above the threshold ------------------

def _placed(pol: policies.HashPolicy, n: int, ports: list[int]) -> dict[FlowKey, int]:
    return {flow(s): pol.choose(flow(s), "leaf1", ports) for s in range(40000, 40000 + n)}


def test_adaptive_moves_one_flow_once_a_queue_stays_above_the_threshold() -> None:
    pol = policies.get("adaptive")(seed=1)
    where = _placed(pol, 8, [1, 2, 3, 4])
    hot = max({1, 2, 3, 4}, key=lambda p: list(where.values()).count(p))
    queues = {p: (60_000 if p == hot else 1_000 * p) for p in (1, 2, 3, 4)}
    assert pol.observe_queues("leaf1", queues, 30_000, now=10.0) == []   # one sample: not yet
    moves = pol.observe_queues("leaf1", queues, 30_000, now=10.1)
    assert len(moves) == 1
    key, old, new = moves[0]
    assert old == hot and where[key] == hot
    assert new == min((p for p in (1, 2, 3, 4) if p != hot), key=queues.__getitem__)
    assert pol.choose(key, "leaf1", [1, 2, 3, 4]) == new      # a late packet-in agrees


def test_adaptive_lets_a_moved_flow_and_a_filled_port_settle() -> None:
    pol = policies.get("adaptive")(seed=1)
    pol.settle_s, pol.dwell_s = 0.5, 2.0
    where = _placed(pol, 2, [1, 2])
    for f in where:                                   # both on port 1, for the test
        pol.placed_on[("leaf1", f)] = (1, (1, 2), float("-inf"))
    hot = {1: 60_000, 2: 0}
    pol.observe_queues("leaf1", hot, 30_000, now=0.0)
    assert len(pol.observe_queues("leaf1", hot, 30_000, now=0.1)) == 1
    # port 2 just took a flow: no second move there for settle_s, whatever port 1 says
    pol.observe_queues("leaf1", hot, 30_000, now=0.2)
    assert pol.observe_queues("leaf1", hot, 30_000, now=0.3) == []
    assert len(pol.observe_queues("leaf1", hot, 30_000, now=0.7)) == 1   # still hot: moves
    assert pol.observe_queues("leaf1", hot, 30_000, now=0.8) == []      # nothing left there


def test_adaptive_moves_nothing_to_a_port_that_is_also_full() -> None:
    pol = policies.get("adaptive")(seed=1)
    _placed(pol, 8, [1, 2])
    full = {1: 60_000, 2: 45_000}
    for t in (0.0, 0.1, 0.2):
        assert pol.observe_queues("leaf1", full, 30_000, now=t) == []
