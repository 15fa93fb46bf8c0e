"""Reports from directories that are not (or not quite) results: one clear error, or fewer plots.

A report is often asked for the wrong directory or for a run that was killed while writing
result.json; the error names the file and what is wrong, as the CLI's other errors do.
"""

from __future__ import annotations

import json

import pytest

from lab.model.errors import LabError
from lab.report import ReportError, compare_rows, write_compare, write_report


def test_missing_directory(tmp_path):
    with pytest.raises(ReportError) as e:
        write_report(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(e.value)
    assert "no such run directory" in str(e.value)


def test_missing_result_json(tmp_path):
    with pytest.raises(ReportError) as e:
        write_report(tmp_path)
    err = e.value
    assert isinstance(err, LabError) and err.exit_status == 2
    assert err.field == str(tmp_path / "result.json")
    assert "not found" in err.message
    assert not (tmp_path / "report.html").exists()


def test_results_directory_instead_of_a_run_names_the_runs(tmp_path):
    for name in ("ecmp-basic-20261202-101010", "ecmp-basic-20261202-111111"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.json").write_text("{}")
    with pytest.raises(ReportError) as e:
        write_report(tmp_path)
    assert "ecmp-basic-20261202-101010" in str(e.value)


@pytest.mark.parametrize("text, words", [
    ('{"schema": 1, "links": [', "not valid JSON (line 1, column"),
    ("", "not valid JSON"),
    (b"\xff\xfe\x00garbage", "not valid JSON"),
    ("[1, 2]", "not a FabricLab result: the top level is a list"),
])
def test_bad_json(tmp_path, text, words):
    path = tmp_path / "result.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(ReportError) as e:
        write_report(tmp_path)
    assert str(path) in str(e.value)
    assert words in str(e.value)
    assert "\n" not in str(e.value)          # one line, as the CLI prints it


def test_compare_names_the_bad_side(tmp_path):
    good, bad = tmp_path / "a", tmp_path / "b"
    good.mkdir()
    bad.mkdir()
    (good / "result.json").write_text(json.dumps(_result()))
    (bad / "result.json").write_text("{oops")
    with pytest.raises(ReportError) as e:
        write_compare(good, bad, tmp_path / "out")
    assert str(bad / "result.json") in str(e.value)
    assert not (tmp_path / "out" / "compare.html").exists()


def _result(**extra) -> dict:
    return {"schema": 1, "scenario": "ecmp-basic", "policy": "hash5", "seed": 1,
            "duration_s": 2.0, "environment": {"datapath": "user"}, "links": [],
            "flows": [], "metrics": {"retransmits": 3}, "fidelity": {"valid": True},
            **extra}


def test_a_result_with_nothing_to_plot_still_reports(tmp_path):
    (tmp_path / "result.json").write_text(json.dumps(_result()))
    html = write_report(tmp_path).read_text()
    index = json.loads((tmp_path / "plots" / "index.json").read_text())
    assert index["plots"] == []
    assert {s["name"] for s in index["skipped"]} == {"weathermap", "util", "queue", "goodput"}
    assert "no plots" in html and "<img" not in html


def test_plots_follow_the_data(tmp_path):
    """Each kind gets its own plots, and only those whose data is in the result."""
    t = [0.1 * i for i in range(30)]
    link = {"node": "leaf1", "peer": "spine1", "port": 3, "bw_mbps": 100.0, "tx_bytes": 10,
            "util_mean": 0.5, "util_max": 0.9, "drops": 0,
            "series": {"t": t, "tx_bps": [5e7] * 30, "queue_bytes": [0] * 29 + [1000]}}
    steps = [{"step": i, "step_s": 0.2 + 0.01 * i, "warmup": i == 0} for i in range(10)]
    phase = {"duration_s": 3.0, "links": [link],
             "flows": [{"id": "r0e0", "goodput_bps": 1e7, "path": ["leaf1", "spine1",
                                                                    "leaf2"]}]}
    coll = _result(kind="collective", phase_details={"a": phase, "b": phase},
                   metrics={"phases": {"a": {"step_series": steps},
                                       "b": {"step_series": steps}}})
    (tmp_path / "result.json").write_text(json.dumps(coll))
    write_report(tmp_path)
    index = json.loads((tmp_path / "plots" / "index.json").read_text())
    made = {p["name"] for p in index["plots"]}
    assert made == {"step-cdf", "util-a", "util-b", "queue-a", "queue-b", "goodput-a",
                    "goodput-b"}
    cdf = next(p for p in index["plots"] if p["name"] == "step-cdf")
    assert cdf["xlabel"] == "step time (ms)" and len(cdf["legend"]) == 2
    assert sorted(p.name for p in (tmp_path / "plots").glob("*.png")) == \
        sorted(f"{n}.png" for n in made)

    # A streaming result without the players' files still shows the stall totals.
    stream = {"id": "incident/big5", "kind": "stream", "dst": "cdn1", "goodput_bps": 5e6,
              "offered_bps": 6e6, "stalls": 2, "stall_s": 1.5}
    run = tmp_path / "streaming"
    run.mkdir()
    (run / "result.json").write_text(json.dumps(_result(
        kind="streaming", phase_details={"incident": {"links": [], "flows": [stream]}},
        metrics={"phases": {"incident": {"stalls": 2, "stall_s": 1.5}}})))
    write_report(run)
    index = json.loads((run / "plots" / "index.json").read_text())
    assert [p["name"] for p in index["plots"]] == ["stall-phases", "goodput-incident",
                                                   "stalls-incident"]


def test_compare_rows_delta_is_b_minus_a():
    a = _result(metrics={"retransmits": 10, "step_p50_s": 0.5, "placement": "packed"})
    b = _result(metrics={"retransmits": 4, "step_p50_s": 0.25, "placement": "scattered",
                         "new": 1})
    rows = {m: (va, vb, d) for m, va, vb, d in compare_rows(a, b)}
    assert rows["retransmits"] == ("10", "4", "-6 (-60.0 %)")
    assert rows["step_p50_s"] == ("0.5 s", "0.25 s", "-0.25 s (-50.0 %)")
    assert rows["placement"][2] == "differs"
    assert rows["new"][2] == "only in B"
    assert rows["duration_s"][2] == "0"
