"""Regression verdicts, baselines and their errors, without emulation (lab.regress)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from lab import regress
from lab.machine.progress import Bar
from lab.regress import Row, ScenarioRun, Stat


def run_with(values: dict[str, list[float]], scenario: str = "ecmp-basic") -> ScenarioRun:
    n = len(next(iter(values.values())))
    sr = ScenarioRun(scenario, "hash5", [], None, list(range(1, n + 1)))
    sr.trial_metrics = [{k: v[i] for k, v in values.items()} for i in range(n)]
    sr.results = [{"policy": "hash5", "seed": i + 1, "fidelity": {"valid": True}}
                  for i in range(n)]
    return sr


def baseline_of(values: dict[str, list[float]]) -> dict:
    return regress.make_baseline([run_with(values)], {"datapath": "user"})


def test_stat_quantiles() -> None:
    s = Stat([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (s.mean, s.p50, s.max) == (3.0, 3.0, 5.0)
    assert s.p95 == pytest.approx(4.8)
    assert Stat([]).p95 == 0.0


def test_same_numbers_pass_and_a_worse_policy_fails_naming_the_metric() -> None:
    base = baseline_of({"imbalance": [1.2, 1.4], "drops": [100.0, 300.0]})
    same = regress.compare(base, [run_with({"imbalance": [1.21, 1.41],
                                            "drops": [150.0, 250.0]})])
    assert [r.status for r in same] == ["ok", "ok"]
    worse = regress.compare(base, [run_with({"imbalance": [4.0, 4.0], "drops": [100.0, 300.0]})])
    bad = regress.regressed(worse)
    assert [(r.metric, r.status) for r in bad] == [("imbalance", "REGRESSED")]
    assert bad[0].delta == pytest.approx(2.7)
    table = regress.render_table("hash-l3", "hash5", worse)
    assert "imbalance" in table and "REGRESSED" in table and "+2.700 (+208%)" in table


def test_tolerance_is_the_larger_of_absolute_and_relative() -> None:
    m = regress.METRICS["step_p99_s"]
    assert m.limit(1.0) == pytest.approx(1.15)       # 15 % of 1 s
    assert m.limit(0.05) == pytest.approx(0.07)      # 0.02 s absolute floor
    assert regress.metric_of("hashed.step_p99_s") is m


def test_improvement_and_missing_metrics() -> None:
    base = baseline_of({"imbalance": [2.0, 2.0], "collisions": [3.0, 3.0]})
    rows = regress.compare(base, [run_with({"imbalance": [1.0, 1.0]})])
    status = {r.metric: r.status for r in rows}
    assert status == {"collisions": "missing", "imbalance": "improved"}
    assert [r.metric for r in regress.regressed(rows)] == ["collisions"]
    assert math.isnan(rows[0].now)


def test_a_baseline_is_of_one_policy() -> None:
    a, b = run_with({"imbalance": [1.0]}), run_with({"imbalance": [1.0]})
    b.policy = "hash-l3"
    with pytest.raises(regress.RegressError, match=r"^policy: a baseline is of one policy"):
        regress.make_baseline([a, b], {})


def test_baseline_round_trip_and_schema_errors(tmp_path: Path) -> None:
    path = tmp_path / "base.json"
    path.write_text(json.dumps(baseline_of({"imbalance": [1.2]})))
    assert regress.load_baseline(path)["policy"] == "hash5"
    cases = {
        "not json": "baseline: ",
        json.dumps({"schema": "fabriclab-baseline/0", "seeds": [1]}): "baseline.schema: ",
        json.dumps([1, 2]): "baseline.schema: ",
        json.dumps({"schema": regress.BASELINE_SCHEMA, "seeds": []}): "baseline.seeds: ",
        json.dumps({"schema": regress.BASELINE_SCHEMA, "seeds": [1],
                    "scenarios": {"x": {"metrics": {"speed": {"mean": 1}}}}}):
            "baseline.scenarios.x.metrics.speed: ",
        json.dumps({"schema": regress.BASELINE_SCHEMA, "seeds": [1],
                    "scenarios": {"x": {"metrics": {"imbalance": {"mean": "big"}}}}}):
            "baseline.scenarios.x.metrics.imbalance.mean: ",
    }
    for text, prefix in cases.items():
        path.write_text(text)
        with pytest.raises(regress.RegressError) as exc:
            regress.load_baseline(path)
        assert str(exc.value).startswith(prefix), str(exc.value)
    with pytest.raises(regress.RegressError, match="cannot read"):
        regress.load_baseline(tmp_path / "absent.json")


def test_junit_names_each_metric_and_fails_the_regressions(tmp_path: Path) -> None:
    rows = [Row("ecmp-basic", "imbalance", 1.2, 4.0, 1.26, "REGRESSED"),
            Row("ecmp-basic", "drops", 10, 12, 110, "ok")]
    path = tmp_path / "j.xml"
    regress.write_junit(path, {"hash-l3": rows})
    import xml.etree.ElementTree as ET
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "1" and suite.get("tests") == "2"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["ecmp-basic.imbalance", "ecmp-basic.drops"]
    assert cases[0].find("failure") is not None and cases[1].find("failure") is None


def test_extract_reads_each_kind() -> None:
    ecmp = {"kind": "ecmp", "flows": [{}] * 8,
            "metrics": {"imbalance": 1.5, "flows_per_uplink": {"a": 5, "b": 3},
                        "max_flows_per_uplink": 5, "uplink_drops": {"a": 7, "b": 1},
                        "goodput_shortfall": 0.1, "retransmits": 12,
                        "max_uplink_util": 0.93, "receiver_cpu_pct": 4.5,
                        "tcp_reorder": {"traffic": {"sum": {
                            "TCPSACKReorder": 3, "TCPTSReorder": 2, "TCPRenoReorder": 0,
                            "TCPDSACKRecv": 9}}}}}
    assert regress.extract(ecmp) == {"imbalance": 1.5, "collisions": 1.0, "drops": 8.0,
                                     "goodput_shortfall": 0.1, "max_uplink_util": 0.93,
                                     "retransmits": 12.0, "reordering": 5.0,
                                     "receiver_cpu_pct": 4.5}
    coll = {"kind": "collective", "metrics": {"phases": {
        "hashed": {"paths": "hash", "step_p99_s": 1.2, "gpu_idle_fraction": 0.7, "drops": 5},
        "placed": {"paths": "balanced", "step_p99_s": 0.5, "gpu_idle_fraction": 0.5,
                   "drops": 0}}}}
    assert regress.extract(coll) == {"hashed.step_p99_s": 1.2,
                                     "hashed.gpu_idle_fraction": 0.7, "hashed.drops": 5.0}


def test_progress_bar_lines_without_a_terminal() -> None:
    out = io.StringIO()
    bar = Bar(4, "regress", stream=out, width=8)
    bar.show("first")
    bar.step("one")
    bar.step("two")
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("regress [........] 0/4")
    assert lines[2].startswith("regress [####....] 2/4, ") and "left  two" in lines[2]


def test_ticker_is_silent_off_a_terminal_and_draws_on_one() -> None:
    from lab.machine.progress import Ticker
    out = io.StringIO()
    with Ticker(1.0, "[x] traffic", stream=out, interval=0.01):
        pass
    assert out.getvalue() == ""

    import threading

    class Tty(io.StringIO):
        full = threading.Event()

        def isatty(self) -> bool:
            return True

        def write(self, s: str) -> int:
            if "##########]" in s:
                self.full.set()
            return super().write(s)
    tty = Tty()
    # The bar's clock is the test's: 0 s at the start, then 0.125 s (half of the bar's 0.25 s),
    # then 0.5 s (past its end), so the frames are 50 % then 100 % however late the thread runs.
    readings = iter([0.0, 0.125])
    with Ticker(0.25, "[x] traffic", stream=tty, width=10, interval=0.001,
                clock=lambda: next(readings, 0.5)):
        assert tty.full.wait(60)          # a hang guard only: frames come every millisecond
    frames = tty.getvalue().split("\r\033[K")
    assert frames[:3] == ["", "[x] traffic [#####.....] 0/0 s",
                          "[x] traffic [##########] 0/0 s"]     # 50 %, then 100 %
    assert set(frames[3:-1]) <= {frames[2]}                      # and no further
    assert frames[-1] == ""                                      # then cleared its line
    assert Ticker(10, "t", stream=out, width=10).line(5.0) == "t [#####.....] 5/10 s"


# -- variants and the side-by-side table -------------------------------------------------------

def test_a_variant_is_a_label_a_policy_and_its_sets() -> None:
    c = regress.parse_variant("mptcp=hash5,traffic.proto=mptcp, traffic.subflows=8")
    assert c == regress.Contender("mptcp", "hash5", ("traffic.proto=mptcp",
                                                     "traffic.subflows=8"))
    assert c.is_variant and not regress.Contender("hash5", "hash5").is_variant


@pytest.mark.parametrize("text", ["hash5", "=hash5", "x=", "x=traffic.proto=mptcp",
                                  "x=hash5,subflows"])
def test_a_malformed_variant_names_the_option(text: str) -> None:
    with pytest.raises(regress.RegressError) as exc:
        regress.parse_variant(text)
    assert exc.value.field == "variant"


def test_side_by_side_puts_each_contender_and_phase_on_a_row() -> None:
    flat = run_with({"imbalance": [1.4, 1.2], "retransmits": [10.0, 30.0]})
    flat.results = [{**r, "kind": "ecmp", "metrics": {"predicted": {"imbalance": 1.5}}}
                    for r in flat.results]
    phased = run_with({"hashed.imbalance": [2.0], "sprayed.imbalance": [1.03],
                       "sprayed.reordering": [500.0]}, scenario="multipath")
    phased.results = [{**r, "kind": "roce", "metrics": {"phases": {
        "hashed": {"split": {"predicted_imbalance": 1.5}}, "sprayed": {}}}}
        for r in phased.results]
    table = regress.side_by_side({"hash5": [flat], "sprayed": [phased]})
    assert table["ecmp-basic"] == [{"contender": "hash5", "phase": "", "imbalance": 1.3,
                                    "retransmits": 20.0, "predicted_imbalance": 1.5}]
    assert [(r["phase"], r.get("predicted_imbalance")) for r in table["multipath"]] == \
        [("hashed", 1.5), ("sprayed", None)]
    text = regress.render_side_by_side(table)
    assert "predicted_imbalance" in text and "sprayed" in text and "500" in text
