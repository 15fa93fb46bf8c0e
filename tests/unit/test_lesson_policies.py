"""The lessons' policy files, offline: the skeleton collides always, the solution never."""

from __future__ import annotations

import random
from pathlib import Path

from controllers import policies
from lab.analysis import offline

LESSON = Path(__file__).resolve().parents[2] / "scenarios" / "ecmp-one-pair"


def one_pair_sets(n_sets: int = 500) -> list[policies.FlowKey]:
    """Eight streams h1 -> h3 per set, like the scenario: one address pair, each stream its
    own server port (5201 + i) and a random client port."""
    rng = random.Random(3)
    return [policies.FlowKey("10.0.0.1", "10.0.0.3", 6, rng.randrange(32768, 61000), 5201 + i)
            for _ in range(n_sets) for i in range(8)]


def test_skeleton_and_solution_offline() -> None:
    flows = one_pair_sets()
    skeleton = policies.resolve(str(LESSON / "exercises" / "end_the_incident.py"))
    solution = policies.resolve(str(LESSON / "solutions" / "end_the_incident.py"))
    bad = offline.bucket_eval(skeleton, flows, "leaf1", [5, 6, 7, 8], 8)
    good = offline.bucket_eval(solution, flows, "leaf1", [5, 6, 7, 8], 8)
    assert bad.collision_prob == 1.0 and bad.max_load_mean == 8
    assert good.collision_prob == 0.0 and good.max_load_p95 == 2
    hash5 = offline.bucket_eval(policies.get("hash5"), flows, "leaf1", [5, 6, 7, 8], 8)
    assert 0.9 < hash5.collision_prob < 1.0        # a hash still collides on most seeds


def test_anti_polarisation_skeleton_polarises_and_solution_does_not() -> None:
    from lab.net.topologies import describe, make_topology
    lesson = LESSON.parent / "ecmp-polarisation"
    topo = describe(make_topology({"type": "fattree", "k": 4}))
    ips = [h["ip"] for h in topo["hosts"]]
    flows = offline.synthetic_flows(3000, random.Random(5), ips, ips)
    for kind, polarised in (("exercises", True), ("solutions", False)):
        cls = policies.resolve(str(lesson / kind / "anti_polarisation.py"))
        report = offline.polarisation_eval(cls, flows, topo, seed=1)
        assert report.polarised is polarised, (kind, report.nmi)
        assert report.second_links_used == (8 if polarised else 16)
