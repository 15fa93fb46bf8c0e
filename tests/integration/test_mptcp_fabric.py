"""MPTCP on real packets: ecmp-one-pair's 8 streams as 8 MPTCP connections of 4 subflows.

The receiver announces its address at 3 ports, so every connection opens 3 more subflows
with 5-tuples of their own. Under ``hash5`` the switches place each subflow like a flow:
the run finds every subflow on the wire, and its counters give each one clean path, the one
the policy's function gives its 5-tuple, with the links' bytes equal to the flows'. Under
``hash-l3`` the same subflows cannot part: the hash sees one address pair, so all 32 share
one uplink, and MPTCP by ports is no fix for an address-only hash.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from lab.workloads import mptcp
from tests.integration.support import (
    check_links_agree_with_flows,
    check_paths_follow_policy,
    run_to,
)

pytestmark = pytest.mark.skipif(mptcp.unavailable() is not None,
                                reason=f"MPTCP: {mptcp.unavailable()}")
SUBFLOWS = 4


def _run(tmp_path: Path, policy: str) -> dict:
    return run_to(tmp_path / policy, "ecmp-one-pair", "--policy", policy,
                  "--set", "traffic.proto=mptcp", "--set", f"traffic.subflows={SUBFLOWS}",
                  "--duration", "4")


def test_every_subflow_is_found_and_follows_the_hash(tmp_path: Path) -> None:
    r = _run(tmp_path, "hash5")
    conns = [f for f in r["flows"] if not f.get("subflow_of")]
    subs = [f for f in r["flows"] if f.get("subflow_of")]
    assert len(conns) == 8 and all(f["subflows"] == SUBFLOWS for f in conns)
    assert Counter(f["subflow_of"] for f in subs) == {f["id"]: SUBFLOWS - 1 for f in conns}
    assert len({(f["sport"], f["dport"]) for f in r["flows"]}) == len(r["flows"])
    assert all(f["path_clean"] for f in r["flows"]), [f["id"] for f in r["flows"]
                                                       if not f["path_clean"]]
    check_paths_follow_policy(r, "hash5")
    assert check_links_agree_with_flows(r) == []
    # the subflows carried data, not only their handshakes (the scheduler uses them)
    assert sum(f["bytes"] for f in subs) > 0.25 * sum(f["bytes"] for f in r["flows"])
    used = [u for u, n in r["metrics"]["flows_per_uplink"].items() if n]
    assert len(used) == 4, r["metrics"]["flows_per_uplink"]
    print({k: r["metrics"][k] for k in ("uplinks", "imbalance", "aggregate_goodput_bps")})


def test_an_address_only_hash_keeps_every_subflow_on_one_uplink(tmp_path: Path) -> None:
    r = _run(tmp_path, "hash-l3")
    assert len(r["flows"]) == 8 * SUBFLOWS
    assert len({tuple(f["path"]) for f in r["flows"]}) == 1
    assert check_links_agree_with_flows(r) == []
