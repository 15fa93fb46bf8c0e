"""On a kernel without netem, delay, jitter and loss are refused before anything starts."""

from __future__ import annotations

import pytest

from lab.machine.environment import qdisc_available
from tests.integration.support import fabriclab, lab_leftovers


@pytest.mark.skipif(qdisc_available("netem delay 1ms"), reason="this kernel has netem")
@pytest.mark.parametrize("scenario, key", [
    ("ecmp-basic", "topology.link_delay_ms"),
    ("incast-ecn", "topology.link_loss_pct"),
])
def test_netem_on_fabric_links_is_refused_naming_the_field(scenario, key):
    r = fabriclab("run", scenario, "--policy", "hash5", "--set", f"{key}=1", check=False)
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"fabriclab: error: {key}:") and "netem" in last, r.stderr
    assert "bringing up" not in r.stdout
    assert not any(lab_leftovers().values())
