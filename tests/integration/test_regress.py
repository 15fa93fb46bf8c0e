"""`fabriclab regress` on real packets: a worse policy fails, the baseline's own passes.

The scenario is ecmp-one-pair: eight elephants between one host pair across four spines,
the founding incident in miniature. A 5-tuple hash spreads them; an L3 hash cannot (one
address pair, one uplink). Two trials of 3 s per policy keep the module near a minute.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.integration.support import fabriclab, results_under

ARGS = ("--scenarios", "ecmp-one-pair", "--trials", "2", "--duration", "3")
#: How far the policy function's own prediction (lab.analysis.predict, no packets) may be from the
#: imbalance the switches' counters measured: the model caps an uplink at its htb rate,
#: the wire carries ~94 % of it as goodput plus headers.
PREDICTION_TOLERANCE = 0.1


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("regress")
    path = tmp / "hash5.json"
    r = fabriclab("regress", "--policy", "hash5", *ARGS, "--baseline", str(path),
                  "--update-baseline", "--out", str(tmp / "base"))
    assert "baseline written" in r.stdout
    return path, tmp


def test_baseline_file_holds_every_trial(baseline: tuple[Path, Path]) -> None:
    path, tmp = baseline
    data = json.loads(path.read_text())
    assert data["schema"] == "fabriclab-baseline/1" and data["policy"] == "hash5"
    assert data["seeds"] == [1, 2]
    metrics = data["scenarios"]["ecmp-one-pair"]["metrics"]
    assert set(metrics) == {"imbalance", "collisions", "drops", "goodput_shortfall",
                            "max_uplink_util", "retransmits", "reordering",
                            "receiver_cpu_pct"}
    runs = results_under(tmp / "base")
    assert len(runs) == 2
    assert metrics["imbalance"]["values"] == [r["metrics"]["imbalance"] for r in runs]
    for d in (tmp / "base").rglob("result.json"):
        assert (d.parent / "report.html").is_file()


def test_the_baselines_own_policy_passes(baseline: tuple[Path, Path]) -> None:
    path, tmp = baseline
    r = fabriclab("regress", "--policy", "hash5", "--baseline", str(path),
                  "--out", str(tmp / "again"), check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "hash5 vs baseline hash5: no regression" in r.stdout
    assert "REGRESSED" not in r.stdout


def test_a_worse_policy_fails_naming_what_moved(baseline: tuple[Path, Path]) -> None:
    path, tmp = baseline
    junit = tmp / "junit.xml"
    r = fabriclab("regress", "--policy", "hash-l3", "--baseline", str(path),
                  "--out", str(tmp / "l3"), "--junit", str(junit), check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("ecmp-one-pair")]
    imbalance = next(ln for ln in lines if ln.split()[1] == "imbalance")
    assert imbalance.split()[-1] == "REGRESSED"
    assert float(imbalance.split()[3]) == pytest.approx(4.0, abs=0.01)   # all on one uplink
    assert "hash-l3 vs baseline hash5: REGRESSION" in r.stdout
    failures = ET.parse(junit).getroot().findall(".//failure")
    assert any("imbalance" in f.get("message", "") for f in failures)


def test_offline_prediction_agrees_with_the_counters(baseline: tuple[Path, Path]) -> None:
    """The policy function, offline, on the same 5-tuples, says what the fabric did."""
    _, tmp = baseline
    runs = results_under(tmp / "base") + results_under(tmp / "l3")
    assert {r["policy"] for r in runs} == {"hash5", "hash-l3"}
    for r in runs:
        mt = r["metrics"]
        pred = mt["predicted"]
        assert not pred["model_only"]
        assert pred["flows_per_uplink"] == mt["flows_per_uplink"], r["policy"]
        assert abs(pred["imbalance"] - mt["imbalance"]) <= PREDICTION_TOLERANCE, \
            (r["policy"], r["seed"], pred["imbalance"], mt["imbalance"])


def test_bad_baseline_and_policy_file_are_refused_before_anything_starts(
        tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "someone-else/3"}))
    r = fabriclab("regress", "--baseline", str(other), check=False)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("fabriclab: error: baseline.schema:")
    broken = tmp_path / "broken.py"
    broken.write_text("class P(HashPolicy:\n")
    r = fabriclab("regress", "--policy-file", str(broken), *ARGS, check=False)
    assert r.returncode == 2
    assert "policy-file:" in r.stderr and "syntax error" in r.stderr
    assert not (Path("results").exists() and any(Path("results").glob("regress-*/seed-*")))
