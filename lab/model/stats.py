"""Statistics the lab reports, defined once so every report, metric and check agrees."""

from __future__ import annotations

from collections.abc import Sequence

from lab.agents.common import percentile as _interpolated


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (q in 0..100), linearly interpolated; 0.0 for no values, so that a
    report's column of an empty set reads as zero rather than missing.

    The arithmetic is the agents' (``lab.agents.common.percentile``): the lab and the
    programs in the hosts compute percentiles one way.
    """
    p = _interpolated(values, q)
    return 0.0 if p is None else p
