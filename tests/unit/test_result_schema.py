"""The schema-1 validator catches what a result must not lack."""

import copy

from lab.model.result import FLOW_KEYS, LINK_KEYS, validate


def minimal_result():
    return {
        "schema": 1, "scenario": "ecmp-basic", "policy": "hash5", "seed": 1, "duration_s": 1.0,
        "environment": {"datapath": "user", "ecn": "tc-bpf", "delay": "none",
                        "controller": "os-ken 4.2.2", "kernel": "6.1"},
        "topology": {"switches": [], "hosts": [], "links": []},
        "links": [dict({k: 0 for k in LINK_KEYS}, series={"t": [0.1], "tx_bps": [5]})],
        "flows": [{k: 0 for k in FLOW_KEYS}],
        "metrics": {}, "fidelity": {"cpu_idle_min_pct": 50.0, "valid": True, "notes": []},
    }


def test_minimal_result_is_valid():
    assert validate(minimal_result()) == []


def test_each_missing_piece_is_named():
    for path in (("fidelity", "valid"), ("environment", "datapath"), ("links", 0, "drops"),
                 ("flows", 0, "path"), ("scenario",)):
        r = copy.deepcopy(minimal_result())
        node = r
        for p in path[:-1]:
            node = node[p]
        del node[path[-1]]
        problems = validate(r)
        assert len(problems) == 1 and str(path[-1]) in problems[0], (path, problems)


def test_other_schema_versions_are_rejected():
    r = minimal_result()
    r["schema"] = 2
    assert validate(r) == ["schema is 2, expected 1"]


def test_series_lengths_must_agree():
    r = minimal_result()
    r["links"][0]["series"]["tx_bps"] = []
    assert "differ in length" in validate(r)[0]
