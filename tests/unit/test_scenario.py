"""Scenario files and --set: every bad value gets one error naming its field."""

import pytest

from lab import kinds
from lab.model import scenario
from lab.model.errors import ScenarioError


def ecmp():
    return scenario.load("ecmp-basic"), kinds.get("ecmp").schema


def test_ecmp_basic_loads_with_the_issue_defaults():
    sc, schema = ecmp()
    p = scenario.validate(dict(sc.params), schema)
    assert sc.kind == "ecmp"
    assert p["topology"]["spines"] == 2 and p["traffic"]["flows"] == 8
    assert p["topology"]["fabric_bw"] == 100
    t = p["topology"]
    assert t["hosts_per_leaf"] * t["host_bw"] == t["spines"] * t["fabric_bw"]   # 1:1


def test_set_dotted_and_bare_keys():
    sc, schema = ecmp()
    p = scenario.apply_sets(sc.params, scenario.parse_set(
        ["traffic.flows=16", "spines=4", "proto=udp", "load=0.5"]), schema)
    scenario.validate(p, schema)
    assert p["traffic"]["flows"] == 16 and p["topology"]["spines"] == 4
    assert p["traffic"]["proto"] == "udp" and p["traffic"]["load"] == 0.5
    assert sc.params["traffic"]["flows"] == 8   # the loaded scenario is not mutated


@pytest.mark.parametrize("item, field, words", [
    ("flows", "--set", "key=value"),
    ("=3", "--set", "key=value"),
    ("nosuchkey=1", "--set", "unknown key"),
    ("traffic.flows=many", "traffic.flows", "expected int"),
    ("traffic.flows=0", "traffic.flows", "out of range"),
    ("traffic.proto=sctp", "traffic.proto", "not one of"),
    ("duration=-1", "duration", "out of range"),
    ("traffic.burst=3", "--set", "unknown key 'traffic.burst'"),
])
def test_bad_set_values(item, field, words):
    sc, schema = ecmp()
    with pytest.raises(ScenarioError) as exc:
        p = scenario.apply_sets(sc.params, scenario.parse_set([item]), schema)
        scenario.validate(p, schema)
    assert exc.value.field == field
    assert words in str(exc.value)


def test_unknown_scenario_lists_the_known_ones():
    with pytest.raises(ScenarioError) as exc:
        scenario.load("no-such-scenario")
    assert exc.value.field == "scenario" and "ecmp-basic" in str(exc.value)


def test_malformed_yaml_names_the_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nkind: ecmp\ntraffic: [flows: 3\n")
    with pytest.raises(ScenarioError) as exc:
        scenario.load(str(bad))
    assert "malformed YAML at line" in str(exc.value)


def test_scenario_without_kind(tmp_path):
    bad = tmp_path / "nokind.yaml"
    bad.write_text("name: x\n")
    with pytest.raises(ScenarioError) as exc:
        scenario.load(str(bad))
    assert exc.value.field == "kind"


def test_unknown_kind():
    with pytest.raises(ScenarioError) as exc:
        kinds.get("teleport")
    assert exc.value.field == "kind"


def test_ecmp_plan_fits_uplinks_and_has_distinct_tuples():
    import random

    from lab.net.topologies import describe, make_topology
    sc, schema = ecmp()
    p = scenario.validate(dict(sc.params), schema)
    d = describe(make_topology(p["topology"]))
    flows = kinds.get("ecmp").plan(d, p, random.Random(3))
    assert len(flows) == 8
    assert {f.src for f in flows} == {"h1", "h2", "h3", "h4"}
    assert {f.dst for f in flows} == {"h5", "h6", "h7", "h8"}
    assert sum(f.rate_bps for f in flows) == pytest.approx(0.9 * 200e6)
    assert len({(f.src_ip, f.dst_ip, f.sport, f.dport) for f in flows}) == 8
    one_pair = scenario.apply_sets(p, [("traffic.pairs", 1)], schema)
    flows = kinds.get("ecmp").plan(d, one_pair, random.Random(3))
    assert {(f.src, f.dst) for f in flows} == {("h1", "h5")}
