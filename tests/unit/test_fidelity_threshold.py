"""The noise band, drift and threshold rule of bench/fidelity_threshold.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "bench" / "fidelity_threshold.py"
_spec = importlib.util.spec_from_file_location("fidelity_threshold", _PATH)
assert _spec is not None and _spec.loader is not None
ft = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ft)


def test_band_is_twice_the_largest_deviation_from_the_median() -> None:
    med, half = ft.noise_band([100.0, 98.0, 103.0])
    assert med == 100.0
    assert half == 6.0
    assert ft.out_of_band(105.9, med, half) == 0
    assert ft.out_of_band(93.9, med, half) == -1


def test_zero_band_means_any_change_drifts() -> None:
    med, half = ft.noise_band([0.0, 0.0, 0.0])
    assert ft.drift(5.0, med) is None          # relative drift of a zero median is undefined
    assert ft.out_of_band(1.0, med, half) == 1
    assert ft.out_of_band(0.0, med, half) == 0


def test_a_step_drifts_only_when_all_its_runs_leave_the_band_on_one_side() -> None:
    assert ft.step_drifted([1, 1])
    assert not ft.step_drifted([1])              # one run is not a shift
    assert not ft.step_drifted([1, 0])
    assert not ft.step_drifted([1, -1])
    assert not ft.step_drifted([0, 0])


def test_threshold_is_the_most_idle_run_that_drifted() -> None:
    assert ft.threshold([(60.0, False), (31.0, True), (45.0, False), (4.0, True)]) == 31.0
    assert ft.threshold([(60.0, False), (50.0, False)]) == 0.0


def test_analyse_uses_only_unloaded_runs_for_the_band() -> None:
    def row(duty: float, x: float, v: float) -> dict:
        return {"duty": duty, "tag": f"d{duty}", "points": [
            {"x_idle_pct": x, "lab_cpu_pct": 5.0, "metrics": {"m": v}}]}
    rows = [row(0, 70, 10.0), row(0, 72, 10.2), row(0, 69, 9.9),
            row(0.4, 40, 10.1), row(0.4, 41, 14.0),            # one noisy run: no drift
            row(0.9, 3, 14.0), row(0.9, 5, 13.0)]
    a = ft.analyse(rows)
    assert a["metrics"]["m"]["median"] == 10.0
    assert a["metrics"]["m"]["drifted_steps"] == [0.9]
    assert a["threshold_pct"] == 5


def test_unloaded_runs_are_spread_over_the_sweep() -> None:
    assert ft.order([0, 0.2, 0.4, 0.6, 0.9], 3) == [0, 0.2, 0.4, 0, 0.6, 0.9, 0]


def test_the_wait_line_is_the_least_waiting_run_that_drifted() -> None:
    assert ft.wait_threshold([(20.0, False), (310.0, True), (150.0, True), (90.0, False)]) \
        == 150.0
    assert ft.wait_threshold([(20.0, False)]) is None


def test_a_rule_is_scored_by_the_runs_it_misjudges() -> None:
    pts = [(10.0, True), (30.0, True), (40.0, False), (20.0, False)]
    # valid from 25: one drifted run called valid (30), one undrifted called invalid (20)
    assert ft.misjudged(pts, lambda x: x >= 25) == (1, 1)
    assert ft.misjudged(pts, lambda x: x >= 35) == (0, 1)


def test_a_class_load_is_its_own_step() -> None:
    """The same duty cycle at the lab's programs' weight drifts (or not) on its own."""
    def row(duty: float, load: str, x: float, w: float, v: float) -> dict:
        return {"duty": duty, "load": load, "tag": f"{load}{duty}", "points": [
            {"x_idle_pct": x, "x_wait_ms": w, "lab_cpu_pct": 5.0, "metrics": {"m": v}}]}
    rows = [row(0, "root", 70, 20, 10.0), row(0, "root", 72, 25, 10.2),
            row(0, "root", 69, 22, 9.9),
            row(0.9, "root", 3, 400, 14.0), row(0.9, "root", 5, 380, 13.0),
            row(0.9, "class", 4, 30, 10.1), row(0.9, "class", 6, 28, 9.95),
            row(0.6, "class", 20, 35, 14.0)]           # one run: not a drift
    a = ft.analyse(rows)
    assert a["metrics"]["m"]["drifted"] == [[0.9, "root"]]
    assert a["threshold_pct"] == 5
    assert a["wait_threshold_ms"] == 380
