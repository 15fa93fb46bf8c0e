"""The lessons' exercises, run as a student would: the skeleton shows the incident, the
solution ends it on real packets, and the counters-only solution names the right uplink."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.integration.support import REPO, check_links_agree_with_flows, fabriclab

LESSON = REPO / "scenarios" / "ecmp-one-pair"
SKELETON = LESSON / "exercises" / "end_the_incident.py"
SOLUTION = LESSON / "solutions" / "end_the_incident.py"


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem + "_under_test", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("lesson")
    out = {}
    for name, policy in (("skeleton", SKELETON), ("solution", SOLUTION)):
        fabriclab("run", "ecmp-one-pair", "--policy", str(policy), "--duration", "3",
                  "--out", str(tmp / name))
        out[name] = json.loads((tmp / name / "result.json").read_text())
    return out


def test_the_skeleton_reproduces_the_incident(runs: dict[str, dict]) -> None:
    mt = runs["skeleton"]["metrics"]
    assert runs["skeleton"]["policy"] == "end-the-incident"
    assert runs["skeleton"]["policy_file"] == str(SKELETON)
    assert mt["flows_per_uplink"]["leaf1->spine1"] == 8
    assert mt["imbalance"] == pytest.approx(4.0, abs=0.01)
    assert sum(mt["uplink_drops"].values()) > 0


def test_the_solution_ends_it(runs: dict[str, dict]) -> None:
    r = runs["solution"]
    mt = r["metrics"]
    assert set(mt["flows_per_uplink"].values()) == {2}
    assert mt["imbalance"] < 1.05
    assert mt["goodput_shortfall"] < 0.05
    assert all(f["path_clean"] for f in r["flows"])
    assert check_links_agree_with_flows(r) == []


def test_congested_uplink_from_counters_alone(runs: dict[str, dict]) -> None:
    solve = load(REPO / "scenarios" / "ecmp-basic" / "solutions" / "congested_uplink.py")
    skeleton = load(REPO / "scenarios" / "ecmp-basic" / "exercises" / "congested_uplink.py")
    r = runs["skeleton"]
    uplinks = {f"{f['path'][0]}->{f['path'][1]}" for f in r["flows"]}
    assert uplinks == {"leaf1->spine1"}
    assert solve.congested_uplink(r) == "leaf1->spine1"
    assert skeleton.congested_uplink(r) is None          # the student's part is left to do
    # Nothing congests when the solution places the streams... or only its busiest port.
    sol = runs["solution"]
    answer = solve.congested_uplink(sol)
    busiest = max(sol["links"], key=lambda ln: ln["drops"])
    assert answer is None or answer == f"{busiest['node']}->{busiest['peer']}"
