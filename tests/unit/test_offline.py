"""Offline policy evaluation (``lab.analysis.offline``) and the per-tier seed policy ``hash5-tier``.

The statistical tests use fixed seeds, so they are deterministic; their tolerances are still
chosen as several standard errors of the sampled quantity, so that a different seed would
pass too and a failure means a broken hash or a broken evaluator, not bad luck.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

import pytest

from controllers import policies
from controllers.policies import FlowKey, HashPolicy
from controllers.policies.hash5_tier import tier_of
from lab.analysis import offline, policycheck
from lab.analysis.bins import expected_max_load, prob_unbalanced
from lab.net.topologies import FatTree, LeafSpine, describe

IPS = [f"10.0.0.{i}" for i in range(1, 17)]


@pytest.fixture(scope="module")
def fat_tree() -> dict[str, Any]:
    return describe(FatTree(k=4))


@pytest.fixture(scope="module")
def pod_flows(fat_tree: dict[str, Any]) -> list[FlowKey]:
    ips = [h["ip"] for h in fat_tree["hosts"]]
    return offline.synthetic_flows(6000, random.Random(21), ips, ips)


# -- synthetic flows --------------------------------------------------------------------------

def test_synthetic_flows_are_repeatable_and_look_like_the_labs() -> None:
    a = offline.synthetic_flows(3000, random.Random(4), IPS, IPS)
    assert a == offline.synthetic_flows(3000, random.Random(4), IPS, IPS)
    assert all(f.src != f.dst and f.proto == 6 for f in a)
    assert all(32768 <= f.sport <= 60999 and 5201 <= f.dport < 5201 + 512 for f in a)
    assert len(set(a)) > 2990                       # 5-tuples, not a handful repeated
    icmp = offline.synthetic_flows(10, random.Random(4), IPS, IPS, proto=1)
    assert all(f.sport == f.dport == 0 for f in icmp)
    anywhere = offline.synthetic_flows(500, random.Random(4), IPS, IPS, dports=range(1, 65536))
    assert max(f.dport for f in anywhere) > 30000


def test_synthetic_flows_refuse_a_single_host() -> None:
    with pytest.raises(ValueError, match="distinct"):
        offline.synthetic_flows(5, random.Random(0), ["10.0.0.1"], ["10.0.0.1"])


# -- buckets and collisions -------------------------------------------------------------------

@pytest.mark.parametrize("nports", [2, 4])
def test_hash5_collides_like_balls_into_bins(nports: int) -> None:
    """8 elephants at a time, 2000 sets: hash5 is indistinguishable from a random hash.

    Standard errors over 2000 sets: ~0.01 (2 ports) and ~0.004 (4 ports) for the collision
    probability, ~0.5 % for the mean max load; the tolerances are ~3 of them.
    """
    flows = offline.synthetic_flows(8 * 2000, random.Random(7), IPS, IPS)
    ports = list(range(5, 5 + nports))
    r = offline.bucket_eval(policies.get("hash5"), flows, "leaf1", ports, 8, seed=3)
    assert r.sets == 2000 and r.flows_used == 16000 and r.fair_share == 8 // nports
    assert r.max_load_expected == pytest.approx(expected_max_load(8, nports))
    assert r.collision_expected == pytest.approx(prob_unbalanced(8, nports))
    assert abs(r.max_load_mean - r.max_load_expected) / r.max_load_expected < 0.03
    assert abs(r.collision_prob - r.collision_expected) < 0.03
    assert r.imbalance_mean == pytest.approx(r.max_load_mean * nports / 8)
    assert abs(r.imbalance_mean - r.imbalance_expected) / r.imbalance_expected < 0.03
    assert r.max_load_p95 == r.max_load_p95_expected
    # A port's count of 16000 flows is binomial: sd 0.8 % (2 ports) and 1.4 % (4) of its
    # expectation, so 5 % is 6 and 3.6 sd; a uniform hash has chi2_p < 0.001 once in 1000
    # draws. The flows and seed are fixed: these are one draw, the same every run.
    assert r.share_max_dev < 0.05 and r.chi2_p > 0.001
    assert not r.worse_than_random and not r.model_only


def test_hash_l3_puts_every_set_of_one_host_pair_on_one_port() -> None:
    flows = offline.synthetic_flows(8 * 500, random.Random(2), ["10.0.0.1"], ["10.0.0.9"])
    r = offline.bucket_eval(policies.get("hash-l3"), flows, "leaf1", [3, 4], 8, seed=1)
    assert r.collision_prob == 1.0
    assert r.max_load_mean == r.max_load_p95 == 8
    assert r.imbalance_mean == 2.0
    assert sorted(r.share.values()) == [0.0, 1.0]
    assert r.worse_than_random
    # hash5 on the very same flows spreads them: the ports are what it hashes on.
    r5 = offline.bucket_eval(policies.get("hash5"), flows, "leaf1", [3, 4], 8, seed=1)
    assert r5.collision_prob < 0.85 and not r5.worse_than_random


def test_bucket_counts_are_the_policys_own_decisions() -> None:
    flows = offline.synthetic_flows(999, random.Random(5), IPS, IPS)
    policy = policies.get("hash5")(seed=9)
    r = offline.bucket_eval(policy, flows, "spine2", [4, 1, 2], 10)
    assert r.ports == [1, 2, 4] and r.sets == 99 and r.flows_used == 990
    direct = [policy.choose(f, "spine2", (1, 2, 4)) for f in flows[:990]]
    assert r.share == {p: direct.count(p) / 990 for p in (1, 2, 4)}
    assert any("left out" in note for note in r.notes)


class _RoundRobin(HashPolicy):
    """A stateful stand-in for a load-aware policy: the next port after the last placed."""

    name = ""                      # empty: never registered, even if imported elsewhere
    granularity = "flow"

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.placements: list[tuple[str, int, float | None]] = []

    def choose(self, flow: FlowKey, switch: str, ports: Sequence[int]) -> int:
        return ports[len(self.placements) % len(ports)]

    def placed(self, flow: FlowKey, switch: str, port: int, rate_bps: float | None) -> None:
        self.placements.append((switch, port, rate_bps))


def test_stateful_policy_is_told_its_placements_and_starts_each_set_fresh() -> None:
    flows = offline.synthetic_flows(7 * 300, random.Random(3), IPS, IPS)
    template = _RoundRobin()
    r = offline.bucket_eval(template, flows, "leaf1", [1, 2], 7, rate_bps=1e6)
    # Round robin over 2 ports from a fresh start is always 4 / 3: never above ceil(7/2).
    assert r.collision_prob == 0.0 and r.max_load_mean == 4.0
    assert r.share == {1: 4 / 7, 2: 3 / 7}        # only true if every set restarted at port 1
    assert template.placements == []              # the caller's instance is left untouched
    seen: list[_RoundRobin] = []

    class Spy(_RoundRobin):
        def placed(self, flow: FlowKey, switch: str, port: int,
                   rate_bps: float | None) -> None:
            super().placed(flow, switch, port, rate_bps)
            if self not in seen:
                seen.append(self)
    offline.bucket_eval(Spy, flows[:70], "leaf1", [1, 2], 7)
    assert len(seen) == 10
    assert all(len(p.placements) == 7 for p in seen)
    assert {rate for p in seen for _, _, rate in p.placements} == {offline.ELEPHANT_BPS}


def test_switch_granularity_is_reported_as_a_model() -> None:
    flows = offline.synthetic_flows(800, random.Random(1), IPS, IPS)
    r = offline.bucket_eval(policies.get("ovs-select"), flows, "leaf1", [3, 4], 8)
    assert r.model_only and r.as_dict()["model_only"] is True
    assert "model only" in policycheck.render(r)
    json.dumps(r.as_dict())


def test_bucket_eval_refuses_what_it_cannot_evaluate() -> None:
    flows = offline.synthetic_flows(10, random.Random(1), IPS, IPS)
    hash5 = policies.get("hash5")
    with pytest.raises(ValueError):
        offline.bucket_eval(hash5, flows, "leaf1", [], 2)
    with pytest.raises(ValueError):
        offline.bucket_eval(hash5, flows, "leaf1", [1, 2], 11)
    with pytest.raises(ValueError):
        offline.bucket_eval(hash5, flows, "leaf1", [1, 2], 0)


@pytest.mark.parametrize(("x", "dof", "p"), [(3.841459, 1, 0.05), (5.991465, 2, 0.05),
                                             (7.814728, 3, 0.05), (11.344867, 3, 0.01),
                                             (0.0, 3, 1.0)])
def test_chi2_survival_matches_the_tables(x: float, dof: int, p: float) -> None:
    assert offline._chi2_sf(x, dof) == pytest.approx(p, abs=1e-6)


# -- polarisation -----------------------------------------------------------------------------

def test_hash5_polarises_the_fat_tree(fat_tree: dict[str, Any],
                                      pod_flows: list[FlowKey]) -> None:
    """One seed, one hash at edge and aggregation: the second choice is the first one's."""
    r = offline.polarisation_eval(policies.get("hash5"), pod_flows, fat_tree, seed=1)
    assert r.first_tier == ["edge"] and r.second_tier == ["agg"]
    assert r.first_buckets == r.second_buckets == 2
    # 12 of a host's 15 peers are in other pods: ~4/5 of the flows cross the core; the share
    # of 6000 flows has sd 0.005, so +-0.03 is 6 sd (a fixed draw: the same every run).
    assert 0.77 < r.flows_evaluated / r.flows < 0.83
    assert r.nmi > 0.99 and r.cramers_v > 0.99 and r.determined == 1.0
    assert r.second_used_mean == 0.5
    assert (r.second_links_used, r.second_links_total) == (8, 16)   # half the core links idle
    assert r.polarised
    assert "POLARISED" in policycheck.render(r)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_hash5_tier_chooses_independently_per_tier(fat_tree: dict[str, Any],
                                                   pod_flows: list[FlowKey],
                                                   seed: int) -> None:
    r = offline.polarisation_eval(policies.get("hash5-tier"), pod_flows, fat_tree, seed=seed)
    assert r.nmi < 0.01 and r.cramers_v < 0.1 and not r.polarised
    assert r.second_used_mean == 1.0
    assert (r.second_links_used, r.second_links_total) == (16, 16)
    for row in r.conditional.values():              # ~4500 flows: sd of a share ~0.01
        assert all(abs(share - 0.5) < 0.05 for share in row.values())
    json.dumps(r.as_dict())


def test_polarisation_needs_two_tiers_of_choices() -> None:
    leaf_spine = describe(LeafSpine(spines=2, leaves=2, hosts_per_leaf=2))
    ips = [h["ip"] for h in leaf_spine["hosts"]]
    flows = offline.synthetic_flows(200, random.Random(1), ips, ips)
    with pytest.raises(ValueError, match="two"):
        offline.polarisation_eval(policies.get("hash5"), flows, leaf_spine)


# -- hash5-tier ---------------------------------------------------------------------------------

def test_tier_is_the_name_without_its_index() -> None:
    assert [tier_of(s) for s in ("leaf1", "spine12", "edge3", "agg0_1", "core4", "s1")] == [
        "leaf", "spine", "edge", "agg", "core", "s"]


def test_hash5_tier_agrees_within_a_tier_and_repartitions_across_tiers() -> None:
    policy = policies.get("hash5-tier")(seed=5)
    assert policy.granularity == "flow"
    flows = offline.synthetic_flows(4000, random.Random(8), IPS, IPS)
    for f in flows[:500]:
        assert policy.choose(f, "edge1", [3, 4]) == policy.choose(f, "edge7", [3, 4])
    moved = sum(policy.choose(f, "edge1", [3, 4]) != policy.choose(f, "agg1", [3, 4])
                for f in flows)
    # Independent choices (here and from hash5's below) differ for each flow with probability
    # 1/2: of 4000 flows the share has sd 0.008, so +-0.05 is 6 sd (a fixed draw: the same
    # every run).
    assert 0.45 < moved / len(flows) < 0.55
    hash5 = policies.get("hash5")(seed=5)
    differs = sum(policy.choose(f, "edge1", [3, 4]) != hash5.choose(f, "edge1", [3, 4])
                  for f in flows)
    assert 0.45 < differs / len(flows) < 0.55


# -- speed and text -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["hash5", "hash5-tier"])
def test_throughput_is_measured(name: str) -> None:
    assert offline.throughput(policies.get(name), n=2000) > 0
    assert offline.throughput(_RoundRobin(), n=500) > 0


def test_render_sets_each_figure_beside_a_random_hash() -> None:
    flows = offline.synthetic_flows(800, random.Random(1), IPS, IPS)
    text = policycheck.render(offline.bucket_eval(policies.get("hash5"), flows, "leaf1", [3, 4], 8))
    assert "random hash" in text and "P(a port > 4 flows)" in text
    assert len(text.splitlines()) < 15


def test_large_sets_get_a_simulated_random_hash_that_matches_the_exact_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the exact computation's budget the expectation is simulated; on a size where
    both exist they agree (1M throws: standard errors ~0.001)."""
    offline._expectation.cache_clear()
    monkeypatch.setattr(offline, "EXACT_BUDGET", 0)
    try:
        sim = offline._expectation(8, 4)
        assert not sim.exact
        assert sim.max_load == pytest.approx(expected_max_load(8, 4), abs=0.01)
        assert sim.prob_unbalanced == pytest.approx(prob_unbalanced(8, 4), abs=0.005)
        flows = offline.synthetic_flows(800, random.Random(1), IPS, IPS)
        r = offline.bucket_eval(policies.get("hash5"), flows, "leaf1", [3, 4, 5, 6], 8)
        assert not r.expected_exact and any("simulated" in n for n in r.notes)
    finally:
        offline._expectation.cache_clear()


def test_policy_check_command_prints_both_evaluations(
        capsys: pytest.CaptureFixture[str]) -> None:
    from lab import cli
    assert cli.main(["policy-check", "--policy", "hash5-tier", "--sets", "300",
                     "--json"]) == 0
    (out,) = json.loads(capsys.readouterr().out)
    assert out["policy"] == "hash5-tier" and out["buckets"]["sets"] == 300
    assert out["polarisation"]["polarised"] is False
    assert cli.main(["policy-check", "--flows", "0"]) == 2
    assert "flows" in capsys.readouterr().err
