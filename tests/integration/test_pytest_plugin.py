"""The `fabric` fixture from a user's own directory, outside this repository.

A user's test file defines its own policy class and asserts on the metrics; pytest finds
the fixture through FabricLab's installed plugin, and the controller imports the user's
file to run that exact class. One test passes, one (hash-l3 on one host pair) must fail.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

USER_TEST = '''
from controllers.policies import HashPolicy
from controllers.policies.base import pack_5tuple, pick, seeded_crc


class MyPolicy(HashPolicy):
    granularity = "flow"

    def choose(self, flow, switch, ports):
        return pick(ports, seeded_crc(pack_5tuple(flow), self.seed + 7))


def test_my_policy_spreads_one_pair(fabric):
    r = fabric.run("ecmp-one-pair", policy=MyPolicy, trials=2, duration=3)
    assert [res["policy"] for res in r.results] == ["test_user_policy.MyPolicy"] * 2
    assert r.imbalance.p95 < 2.0
    assert r.predicted_imbalance.values == [res["metrics"]["predicted"]["imbalance"]
                                            for res in r.results]


def test_l3_hash_cannot(fabric):
    r = fabric.run("ecmp-one-pair", policy="hash-l3", trials=1, duration=3)
    assert r.imbalance.p95 < 1.3
'''


def test_fixture_works_from_a_directory_outside_the_repo(tmp_path: Path) -> None:
    (tmp_path / "test_user_policy.py").write_text(USER_TEST)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "--fabriclab-out", str(tmp_path / "runs"), "test_user_policy.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    print(r.stdout[-3000:], r.stderr[-2000:])
    assert r.returncode == 1                          # the hash-l3 test must fail
    assert "1 failed, 1 passed" in r.stdout
    assert "FAILED test_user_policy.py::test_l3_hash_cannot" in r.stdout
    assert "assert 4.0 < 1.3" in r.stdout
    runs = sorted((tmp_path / "runs").rglob("result.json"))
    assert len(runs) == 3
    controller_logs = [p.read_text() for p in (tmp_path / "runs").rglob("controller.log")]
    assert any("policy test_user_policy.MyPolicy (flow)" in log for log in controller_logs)
