"""Bad input, fuzzed, typed at the real CLI: one line naming the field, exit 2, nothing left.

The inputs are the generated ``--set`` items and scenario files of the in-process fuzz tests
(``tests/fuzzing.py``); each bad one is first refused in-process, and the CLI must print
exactly that refusal as its only line. While the bad inputs run, this test holds the lab
lock itself: no other run is mid-way when ``lab_leftovers()`` is read after each one, and a
bad input that wrongly got past validation would fail at once on the lock (their
``FABRICLAB_LOCK_WAIT`` is 0) instead of building a fabric. One generated valid input is
then run for real.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lab import run
from lab.machine import state
from lab.model.errors import LabError
from tests.fuzzing import Tally, named_sets, scenario_files
from tests.integration.support import fabriclab, lab_leftovers

ERROR = "fabriclab: error: "
#: Bad inputs per test (each is one ~1 s CLI start-up): 12 --set lists + 10 files.
FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


@pytest.fixture
def lab_held(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This test holds the lab lock; the CLIs it starts do not wait for it."""
    lock = state.LabLock()
    lock.acquire(wait_s=1800)                 # other engineers' runs finish first
    monkeypatch.setenv(state.LOCK_WAIT_ENV, "0")
    try:
        yield
    finally:
        lock.release()


def refusal(name: str, sets: list[str] | None = None) -> LabError | None:
    """What ``fabriclab run`` must answer, found in-process; None for a valid input."""
    try:
        run.check_input(name, sets=sets)
    except LabError as exc:
        return exc
    return None


def assert_refused_like_in_process(args: list[str], expected: LabError) -> None:
    r = fabriclab("run", *args, check=False, timeout=60)
    assert "Traceback" not in r.stdout + r.stderr
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [ERROR + str(expected)]
    left = lab_leftovers()
    assert not any(left.values()), f"bad input {args!r} left {left}"


def test_fuzzed_set_items_are_refused_by_the_cli(lab_held: None) -> None:
    tally = Tally()

    @settings(FUZZ, max_examples=12)
    @given(named=named_sets)
    def check(named: tuple[str, list[str]]) -> None:
        name, sets = named
        assume(not any("\0" in item for item in sets))     # argv cannot carry NUL
        expected = refusal(name, sets)
        assume(expected is not None)
        assert_refused_like_in_process([name, *(f"--set={item}" for item in sets)], expected)
        tally.refused[expected.field] += 1

    check()
    print(tally.line("CLI fuzzed --set"))


def test_fuzzed_scenario_files_are_refused_by_the_cli(lab_held: None, tmp_path: Path) -> None:
    tally = Tally()
    path = tmp_path / "fuzzed.yaml"

    @settings(FUZZ, max_examples=10)
    @given(content=scenario_files)
    def check(content: bytes) -> None:
        path.write_bytes(content)
        expected = refusal(str(path))
        assume(expected is not None)
        assert_refused_like_in_process([str(path)], expected)
        tally.refused[expected.field] += 1

    check()
    print(tally.line("CLI fuzzed scenario files"))


#: A valid ecmp-basic: few flows, any seed, one policy (the default "all" runs six).
valid_sets = st.tuples(st.integers(1, 8), st.integers(0, 2**31 - 1),
                       st.sampled_from(["hash5", "ovs-select", "hash-l3", "hash5-tier"]),
                       st.sampled_from(["tcp", "udp"]))


def test_a_generated_valid_input_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Of 20 generated valid inputs (each checked in-process), the one with the most flows
    runs for real: the first examples hypothesis generates are the simplest."""
    chosen: list[tuple[int, int, list[str]]] = []

    @settings(FUZZ, max_examples=20)
    @given(values=valid_sets)
    def collect(values: tuple[int, int, str, str]) -> None:
        flows, seed, policy, proto = values
        sets = [f"traffic.flows={flows}", f"seed={seed}", f"policy={policy}",
                f"traffic.proto={proto}"]
        assert refusal("ecmp-basic", sets) is None
        chosen.append((flows, seed, sets))

    collect()
    sets = max(chosen)[2]
    monkeypatch.setenv(state.LOCK_WAIT_ENV, "1800")
    out = tmp_path / "out"
    r = fabriclab("run", "ecmp-basic", *(f"--set={s}" for s in sets), "--duration", "1",
                  "--out", str(out), check=False, timeout=1800 + 300)
    assert "Traceback" not in r.stdout + r.stderr
    assert r.returncode == 0, r.stderr
    result = json.loads((out / "result.json").read_text())
    given_ = dict(s.split("=", 1) for s in sets)
    assert len(result["flows"]) == int(given_["traffic.flows"])
    assert result["seed"] == int(given_["seed"]) and result["policy"] == given_["policy"]
    assert {f["proto"] for f in result["flows"]} == {given_["traffic.proto"]}
    print(f"CLI valid run: ecmp-basic {' '.join(sets)} --duration 1")
