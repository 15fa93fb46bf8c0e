"""Balls-into-bins expectation, checked against brute force and simulation."""

import itertools
import random

import pytest

from lab.analysis import bins as metrics


def brute_expected_max(n, s):
    loads = [max(map(c.count, range(s))) for c in itertools.product(range(s), repeat=n)]
    return sum(loads) / len(loads)


@pytest.mark.parametrize("n, s", [(1, 2), (4, 2), (8, 2), (5, 3), (6, 4)])
def test_expected_max_matches_enumeration(n, s):
    assert metrics.expected_max_load(n, s) == pytest.approx(brute_expected_max(n, s))


def test_expected_max_matches_simulation_for_a_bigger_case():
    rng = random.Random(7)
    trials = 20000
    total = 0
    for _ in range(trials):
        bins = [0] * 4
        for _ in range(16):
            bins[rng.randrange(4)] += 1
        total += max(bins)
    assert metrics.expected_max_load(16, 4) == pytest.approx(total / trials, rel=0.02)


def test_prob_unbalanced_eight_flows_two_uplinks():
    # Balanced only when exactly 4 of 8 land on each: C(8,4)/2^8.
    assert metrics.prob_unbalanced(8, 2) == pytest.approx(1 - 70 / 256)


def test_imbalance():
    assert metrics.imbalance([1, 1, 1, 1]) == 1.0
    assert metrics.imbalance([3, 1]) == pytest.approx(1.5)
    assert metrics.imbalance([0, 0]) == 0.0
