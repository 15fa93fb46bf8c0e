"""A switch's uplinks as the run's counters saw them: the links from it to other switches,
where a hash, a sprayer or a moved flow decides the split. One definition for every kind
that reports the split (ecmp's streams, roce's sprayed QPs)."""

from __future__ import annotations

from typing import Any

from lab.analysis import bins


def of(links: list[dict[str, Any]], topo: dict[str, Any],
       switch: str) -> dict[str, dict[str, Any]]:
    """{``switch->peer``: the link entry} for ``switch``'s links towards other switches."""
    hosts = {h["name"] for h in topo["hosts"]}
    return {f"{switch}->{ln['peer']}": ln for ln in links
            if ln["node"] == switch and ln["peer"] not in hosts}


def split(up: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Of uplinks (``of``'s): each one's mean utilisation, the busiest one's, and the
    imbalance (max/mean of their bytes)."""
    return {"uplinks": {name: ln["util_mean"] for name, ln in up.items()},
            "max_uplink_util": max((ln["util_mean"] for ln in up.values()), default=0.0),
            "imbalance": round(bins.imbalance([ln["tx_bytes"] for ln in up.values()]), 4)}
