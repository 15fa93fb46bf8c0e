"""Shared test set-up: integration tests need root and a running Open vSwitch."""

import os

import pytest

from lab.machine import ovs_service


def pytest_collection_modifyitems(config, items):
    if os.geteuid() == 0 and ovs_service.running():
        return
    skip = pytest.mark.skip(reason="integration tests need root and a running Open vSwitch "
                                   "(run: sudo make test)")
    for item in items:
        if "integration" in item.nodeid.split("/"):
            item.add_marker(skip)
