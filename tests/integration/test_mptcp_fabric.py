"""MPTCP on real packets: ecmp-one-pair's 8 streams as 8 MPTCP connections of 8 subflows.

The receiver announces its address at 7 ports, so every connection opens 7 more subflows
with 5-tuples of their own. Under ``hash5`` the switches place each subflow like a flow:
the run finds every subflow on the wire, and its counters give each one clean path, the one
the policy's function gives its 5-tuple, with the links' bytes equal to the flows'. Under
``hash-l3`` the same subflows cannot part: the hash sees one address pair, so all 64 share
one uplink, and MPTCP by ports is no fix for an address-only hash. And in the lesson's
side-by-side table (scenarios/multipath), MPTCP and adaptive routing both even out the
uplinks that per-flow hashing stacks.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from lab.workloads import mptcp
from tests.integration.support import (
    check_links_agree_with_flows,
    check_paths_follow_policy,
    fabriclab,
    results_under,
    run_to,
    valid_run,
)

pytestmark = pytest.mark.skipif(mptcp.unavailable() is not None,
                                reason=f"MPTCP: {mptcp.unavailable()}")
SUBFLOWS = 8


def _side_by_side(out: Path) -> dict:
    """One regress of the lesson's three contenders on ecmp-one-pair; its runs' fidelity
    as one result's phases, so that a CPU-bound trial runs the whole table again."""
    r = fabriclab("regress", "--scenarios", "ecmp-one-pair", "--trials", "1", "--duration", "3",
                  "--policy", "hash5", "--policy", "adaptive", "--variant",
                  f"mptcp=hash5,traffic.proto=mptcp,traffic.subflows={SUBFLOWS}",
                  "--out", str(out), check=False, timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = {d.name: results_under(d) for d in out.iterdir() if d.is_dir()}
    return {"stdout": r.stdout, "out": out, "runs": runs,
            "fidelity": {"phases": {n: rs[0]["fidelity"] for n, rs in runs.items()}}}


@pytest.fixture(scope="module")
def side(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("side-by-side")
    return valid_run(lambda n: _side_by_side(tmp / f"try{n}"), "regress side by side")


def test_every_subflow_is_found_and_follows_the_hash(side: dict) -> None:
    (r,) = side["runs"]["mptcp"]
    conns = [f for f in r["flows"] if not f.get("subflow_of")]
    subs = [f for f in r["flows"] if f.get("subflow_of")]
    assert len(conns) == 8 and all(f["subflows"] == SUBFLOWS for f in conns)
    assert Counter(f["subflow_of"] for f in subs) == {f["id"]: SUBFLOWS - 1 for f in conns}
    assert len({(f["sport"], f["dport"]) for f in r["flows"]}) == len(r["flows"])
    assert all(f["path_clean"] for f in r["flows"]), [f["id"] for f in r["flows"]
                                                       if not f["path_clean"]]
    # A subflow the scheduler sent nothing on in the window has no forward path to check
    # (only the receiver's window updates came back): only subflows, and few.
    idle = [f for f in r["flows"] if not f["path"]]
    assert all(f.get("subflow_of") and f["bytes"] == 0 for f in idle), idle
    assert len(idle) <= len(subs) // 4, [f["id"] for f in idle]
    check_paths_follow_policy({**r, "flows": [f for f in r["flows"] if f["path"]
                                              and f["reverse_path"]]}, "hash5")
    assert check_links_agree_with_flows(r) == []
    # the subflows carried data, not only their handshakes (the scheduler uses them)
    assert sum(f["bytes"] for f in subs) > 0.25 * sum(f["bytes"] for f in r["flows"])
    used = [u for u, n in r["metrics"]["flows_per_uplink"].items() if n]
    assert len(used) == 4, r["metrics"]["flows_per_uplink"]
    print({k: r["metrics"][k] for k in ("uplinks", "imbalance", "aggregate_goodput_bps")})


def test_an_address_only_hash_keeps_every_subflow_on_one_uplink(tmp_path: Path) -> None:
    r = run_to(tmp_path / "hash-l3", "ecmp-one-pair", "--policy", "hash-l3",
               "--set", "traffic.proto=mptcp", "--set", f"traffic.subflows={SUBFLOWS}",
               "--duration", "3")
    assert len(r["flows"]) == 8 * SUBFLOWS
    assert len({tuple(f["path"]) for f in r["flows"]}) == 1
    assert check_links_agree_with_flows(r) == []


def test_the_fixes_side_by_side_beat_the_hash_and_say_what_they_cost(side: dict) -> None:
    """The lesson's table (scenarios/multipath): per-flow hashing, adaptive routing and
    MPTCP on one collision, every row the means of its own runs' counters."""
    table = side["stdout"].split("== side by side")[1]
    print(table)
    rows = {row["contender"]: row
            for row in json.loads((side["out"] / "regress.json").read_text())
            ["side_by_side"]["ecmp-one-pair"]}
    assert list(rows) == ["hash5", "adaptive", "mptcp"]
    for name, row in rows.items():
        assert next(ln for ln in table.splitlines() if ln.startswith(name + " "))
        (result,) = side["runs"][name]
        assert row["imbalance"] == pytest.approx(result["metrics"]["imbalance"], abs=1e-4)
        assert row["receiver_cpu_pct"] > 0 and row["reordering"] >= 0, row
    assert rows["hash5"]["imbalance"] > 1.3                  # seed 1's collision
    assert rows["adaptive"]["imbalance"] < 0.9 * rows["hash5"]["imbalance"]
    assert rows["mptcp"]["imbalance"] < rows["hash5"]["imbalance"]
