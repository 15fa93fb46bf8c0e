"""Load-balance metrics and the balls-into-bins expectation they are read against.

A per-flow hash puts N flows on S uplinks like N balls thrown into S bins: even a perfect hash
collides. Reporting the measured maximum beside its expectation tells a policy that is merely
unlucky from one that is worse than random.
"""

from __future__ import annotations

from functools import cache
from math import comb


@cache
def _ways_max_at_most(n: int, s: int, m: int) -> int:
    """Number of ways to put n labelled balls into s labelled bins with every bin <= m."""
    if s == 0:
        return 1 if n == 0 else 0
    return sum(comb(n, i) * _ways_max_at_most(n - i, s - 1, m) for i in range(min(n, m) + 1))


def prob_max_at_most(n: int, s: int, m: int) -> float:
    """P(the fullest of s bins holds <= m of n uniformly thrown balls)."""
    if n == 0:
        return 1.0
    return _ways_max_at_most(n, s, m) / s ** n


def expected_max_load(n: int, s: int) -> float:
    """E[max bin load] for n balls in s bins, exact: sum over m of P(max > m)."""
    if s <= 0:
        raise ValueError("need at least one bin")
    return sum(1.0 - prob_max_at_most(n, s, m) for m in range(n))


def prob_unbalanced(n: int, s: int) -> float:
    """P(some bin holds more than its fair share ceil(n/s)) - i.e. a collision congests."""
    fair = -(-n // s)
    return 1.0 - prob_max_at_most(n, s, fair)


def imbalance(values: list[float]) -> float:
    """max/mean; 1.0 is perfect balance. 0 when nothing was carried."""
    if not values:
        return 0.0
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else 0.0

