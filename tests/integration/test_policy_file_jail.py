"""`fabriclab run --policy FILE` as root: the file's code runs in the controller's policy jail,
not in the controller. A policy that reports who it runs as and whether it can reach the
network, kept where only root can read it (mode 0600 in a 0700 folder), decides a real run's
flows; what it printed comes back in ``policy.log``, and the jail goes with the run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controllers.policies import HashPolicy
from controllers.policies.base import pack_5tuple, pick, seeded_crc
from tests.integration.support import (
    assert_nothing_left_behind,
    check_paths_follow_policy,
    run_to,
)

POLICY = '''
import os, socket, sys
from controllers.policies import HashPolicy
from controllers.policies.base import pack_5tuple, pick, seeded_crc


class Told(HashPolicy):
    granularity = "flow"

    def __init__(self, seed=0):
        super().__init__(seed)
        try:
            socket.create_connection(("127.0.0.1", 6640), timeout=1).close()
            net = "network reached"
        except OSError as exc:
            net = f"no network ({type(exc).__name__})"
        print(f"uid {os.getuid()} euid {os.geteuid()}; {net}", file=sys.stderr, flush=True)

    def choose(self, flow, switch, ports):
        return pick(ports, seeded_crc(pack_5tuple(flow), self.seed + 11))
'''


def jail_dirs() -> set[Path]:
    """The policy jails' scratch folders on the machine now (another process, this test
    session among them, may hold jails of its own)."""
    return set(Path("/tmp").glob("fabriclab-policy-*"))


@pytest.fixture(scope="module")
def before() -> set[Path]:
    return jail_dirs()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, before: set[Path]) -> tuple[dict, Path]:
    home = tmp_path_factory.mktemp("private")
    home.chmod(0o700)
    policy = home / "told.py"
    policy.write_text(POLICY)
    policy.chmod(0o600)
    out = tmp_path_factory.mktemp("told") / "out"
    return run_to(out, "ecmp-one-pair", "--policy", str(policy), "--duration", "3",
                  need_valid=False), out


def test_the_policy_s_code_ran_unprivileged_without_network(run: tuple[dict, Path]) -> None:
    result, out = run
    assert result["policy"] == "told.Told", result["policy"]
    said = (out / "policy.log").read_text().splitlines()
    nobody = 65534
    assert said and all(line.startswith(f"uid {nobody} euid {nobody}; no network")
                        for line in said), said
    assert os.geteuid() == 0                 # the lab ran as root; the file did not


class SameDecisions(HashPolicy):
    """The file's decision, written here: the test does not import the file as root."""

    granularity = "flow"

    def choose(self, flow, switch, ports):
        return pick(ports, seeded_crc(pack_5tuple(flow), self.seed + 11))


def test_its_decisions_are_the_paths_the_packets_took(run: tuple[dict, Path]) -> None:
    result, _ = run
    check_paths_follow_policy(result, SameDecisions)


def test_the_jail_goes_with_the_run(run: tuple[dict, Path], before: set[Path]) -> None:
    assert_nothing_left_behind()
    assert jail_dirs() - before == set()
