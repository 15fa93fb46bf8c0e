"""Shared test set-up: integration tests need root and a running Open vSwitch."""

import os
import sys

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


def pytest_terminal_summary(terminalreporter):
    """The CPU-bound runs the integration tests ran again (``support.valid_run``): counted
    in every summary, so a machine too loaded for the lab shows up even when the re-runs
    passed."""
    support = sys.modules.get("tests.integration.support")
    reruns = support.RERUNS if support is not None else []
    terminalreporter.section("re-runs of CPU-bound runs")
    terminalreporter.write_line(f"{len(reruns)} re-run(s) of CPU-bound scenario runs")
    for line in reruns:
        terminalreporter.write_line(f"  {line}")
