"""A pytest plugin for users' own repositories: regression-test a hash policy on real packets.

Installed with FabricLab (entry point ``pytest11``), so a user's test file needs no set-up::

    from controllers.policies import HashPolicy

    class MyPolicy(HashPolicy):
        granularity = "flow"
        def choose(self, flow, switch, ports): ...

    def test_policy(fabric):
        r = fabric.run("ecmp-basic", policy=MyPolicy, trials=10)
        assert r.imbalance.p95 < 1.3

``fabric.run`` runs the scenario once per seed on a fresh emulated fabric, with the policy
class handed to the controller by its file (the controller imports that same file, so the
switches run exactly the code under test). Each metric of ``lab.regress`` is an attribute with
``values``, ``mean``, ``p50``, ``p95`` and ``max``; ``r.results`` are the result.json contents,
``r.dirs`` their directories (report.html included), and ``r.predicted_imbalance`` what the
policy function itself predicts for the same flows (``lab.analysis.predict``).

The fixture skips, with the reason, on a machine that cannot emulate (not root, no Open
vSwitch): a policy's unit tests should not fail because the laptop is not a lab.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from controllers import policies
from lab.regress import ScenarioRun, Stat, run_trials


class Trials:
    """One scenario under one policy over several seeds, as a test reads it."""

    def __init__(self, run: ScenarioRun) -> None:
        self.run = run
        self.results = run.results
        self.dirs = run.dirs
        self.metrics: dict[str, Stat] = run.stats

    def __getattr__(self, name: str) -> Stat:
        """``r.imbalance``; for a phased scenario ``r.step_p99_s`` if one phase has it."""
        metrics = self.__dict__.get("metrics", {})
        if name in metrics:
            return metrics[name]
        matches = [k for k in metrics if k.rsplit(".", 1)[-1] == name]
        if len(matches) == 1:
            return metrics[matches[0]]
        if matches:
            raise AttributeError(f"{name!r} is in several phases ({', '.join(matches)}): use "
                                 f"r.metric('<phase>.{name}')")
        raise AttributeError(f"no metric {name!r} in this run (have: {', '.join(metrics)})")

    def metric(self, key: str) -> Stat:
        return self.metrics[key]

    @property
    def predicted_imbalance(self) -> Stat:
        """The policy's own prediction for each trial's flows (ecmp scenarios)."""
        return Stat([r["metrics"]["predicted"]["imbalance"] for r in self.results
                     if "predicted" in r.get("metrics", {})])

    @property
    def valid(self) -> bool:
        """Every trial had CPU to spare: the numbers describe the network, not the emulator."""
        return not self.run.invalid_trials

    def __repr__(self) -> str:
        stats = ", ".join(f"{k}={s.mean:.3g}" for k, s in self.metrics.items())
        return f"<{self.run.scenario} x{len(self.results)} {self.run.policy}: {stats}>"


class FabricRunner:
    """What the ``fabric`` fixture gives a test: ``run`` a scenario under a policy."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir

    def run(self, scenario: str, policy: str | type[policies.HashPolicy] = "hash5",
            trials: int = 1, seed: int = 1, sets: Sequence[str] = (),
            duration: float | None = None) -> Trials:
        """Run ``scenario`` with seeds ``seed .. seed+trials-1``; see the module docstring."""
        spec = policy if isinstance(policy, str) else policies.spec_of(policy)
        seeds = list(range(seed, seed + trials))
        return Trials(run_trials(scenario, spec, seeds, self.out_dir, sets, duration))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fabriclab")
    group.addoption("--fabriclab-out", metavar="DIR",
                    help="keep the fabric fixture's run directories here (default: pytest's "
                         "temporary directory)")


def pytest_configure(config: pytest.Config) -> None:
    # The lab resolves the policy's file as ``fabriclab run`` does: in a jail when root.
    from lab.machine import jail
    jail.guard_policy_files()
    # Mininet's own use of distutils, not the user's code: keep their warning summary theirs.
    config.addinivalue_line("filterwarnings",
                            "ignore:distutils Version classes are deprecated:DeprecationWarning")


def _cannot_emulate() -> str | None:
    if os.geteuid() != 0:
        return "FabricLab emulation needs root (namespaces, veths, OVS bridges)"
    from lab.machine import ovs_service
    if not ovs_service.running():
        return "Open vSwitch is not running (run FabricLab's `make setup`)"
    return None


@pytest.fixture(scope="session")
def fabric(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> FabricRunner:
    """Runs FabricLab scenarios on emulated fabrics (see ``lab.testing``)."""
    why = _cannot_emulate()
    if why:
        pytest.skip(why)
    out = request.config.getoption("--fabriclab-out")
    return FabricRunner(Path(out) if out else tmp_path_factory.mktemp("fabriclab"))

