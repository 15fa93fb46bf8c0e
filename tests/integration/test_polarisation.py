"""Polarisation on real packets, and the offline evaluation saying the same for the same flows.

ecmp-polarisation: 16 flows from edge1 to a far pod of a k=4 fat-tree. Under hash5 (one seed,
the same fields at every tier) each aggregation switch repeats the edge's choice, so the
switches' counters show only 2 of the 4 aggregation->core links used; hash5-tier mixes the
tier into the seed and uses all 4. ``lab.analysis.offline.polarisation_eval``, given the same
5-tuples and topology, must count the same second-tier links.
"""

from __future__ import annotations

import pytest

from controllers import policies
from controllers.policies import FlowKey
from lab.analysis import offline
from tests.integration.support import fabriclab, run_scenario

EXPECT = {"hash5": 2, "hash5-tier": 4}


@pytest.mark.parametrize("policy", list(EXPECT))
def test_core_links_used_match_the_offline_evaluation(tmp_path, policy: str) -> None:
    r = run_scenario(tmp_path, "ecmp-polarisation", "--policy", policy, "--duration", "3")
    up = r["metrics"]["upward_links_used"]
    assert len(up["edge->agg"]["used"]) == 2 == up["edge->agg"]["of"]
    core = up["agg->core"]
    assert core["of"] == 4
    assert len(core["used"]) == EXPECT[policy], core
    assert all(f["path_clean"] and len(f["path"]) == 5 for f in r["flows"])
    flows = [FlowKey(f["src_ip"], f["dst_ip"], 6, f["sport"], f["dport"]) for f in r["flows"]]
    report = offline.polarisation_eval(policies.get(policy), flows, r["topology"],
                                       seed=r["seed"])
    assert report.flows_evaluated == len(flows)
    assert report.second_links_total == 4
    assert report.second_links_used == len(core["used"])
    assert report.polarised == (policy == "hash5")


def test_polarisation_scenario_is_listed() -> None:
    assert "ecmp-polarisation" in fabriclab("list").stdout
