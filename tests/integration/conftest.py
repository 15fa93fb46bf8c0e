"""Integration tests check, after each test, that the lab left nothing on the machine; runs
that several modules read are made once (``shared_run``)."""

from pathlib import Path

import pytest

from tests.integration.support import assert_nothing_left_behind, run_to


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    # With the lab lock held no run is in progress: another user's run on the same machine
    # (CI, a benchmark) is not mistaken for something this test left behind.
    assert_nothing_left_behind()


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory):
    """``shared_run(SCENARIO, *ARGS)``: the folder of one valid ``fabriclab run`` of it, made
    the first time a module asks and handed to every module that asks again.

    Why: several modules read the same run for different claims (its numbers, its report's
    weathermap); each making its own costs CI minutes of 2 cores and measures nothing more.
    A module that writes into the folder (a report) writes what any other would.
    """
    runs: dict[tuple[str, ...], Path] = {}

    def get(scenario: str, *args: str, timeout: float = 600) -> Path:
        key = (scenario, *args)
        if key not in runs:
            out = tmp_path_factory.mktemp(scenario) / "run"
            run_to(out, scenario, *args, timeout=timeout)
            runs[key] = out
        return runs[key]
    return get
