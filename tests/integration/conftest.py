"""Integration tests check, after each test, that the lab left nothing on the machine."""

import pytest

from tests.integration.support import lab_leftovers


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    left = lab_leftovers()
    assert not any(left.values()), f"the lab left things behind: {left}"
