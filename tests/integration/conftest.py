"""Integration tests check, after each test, that the lab left nothing on the machine."""

import pytest

from tests.integration.support import assert_nothing_left_behind


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    # With the lab lock held no run is in progress: another user's run on the same machine
    # (CI, a benchmark) is not mistaken for something this test left behind.
    assert_nothing_left_behind()
