"""Fixed source ports never meet the ports a lab host's kernel picks for itself.

iperf3's control connection takes an ephemeral port; had it been one another flow's
``--cport``, that flow failed with "Address already in use" (seen once in CI, fat-tree k=4).
"""

import random

from lab import kinds
from lab.kinds.collective import run as jobrun
from lab.model import scenario
from lab.model.flows import FIXED_SPORTS, HOST_EPHEMERAL_PORTS, pick_source_ports
from lab.net.topologies import describe, make_topology

EPHEMERAL = range(HOST_EPHEMERAL_PORTS[0], HOST_EPHEMERAL_PORTS[1] + 1)


def test_the_ranges_are_disjoint():
    assert max(FIXED_SPORTS) < min(EPHEMERAL)
    assert max(jobrun.SPORT_RANGE) < min(EPHEMERAL)
    assert max(EPHEMERAL) <= 65535
    ports = pick_source_ports(2000, random.Random(7))
    assert len(set(ports)) == 2000 and not set(ports) & set(EPHEMERAL)


def _plan(name: str, seed: int) -> list:
    sc = scenario.load(name)
    kind = kinds.get(sc.kind)
    params = scenario.validate(dict(sc.params), kind.schema)
    desc = describe(make_topology(params["topology"]))
    return kind.plan(desc, params, random.Random(seed))


def test_every_planned_flow_binds_a_port_outside_the_hosts_ephemeral_range():
    for name in ("ecmp-basic", "ecmp-one-pair", "ecmp-polarisation", "streaming-incident"):
        for seed in range(1, 6):
            flows = _plan(name, seed)
            assert flows, name
            for f in flows:
                assert f.sport not in EPHEMERAL, (name, seed, f)
