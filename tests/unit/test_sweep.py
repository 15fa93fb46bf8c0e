"""The size sweep without a fabric: its bad input and nccl-tests' arithmetic over records."""

from __future__ import annotations

import pytest

from lab import run
from lab.kinds.collective import metrics as jm
from lab.model.errors import ScenarioError


@pytest.mark.parametrize("sets, field", [
    (["phases.synthetic.job.sizes=[65536, 100]"], "phases.synthetic.job.sizes"),  # not /8
    (["phases.gloo.job.sizes=[65538]"], "phases.gloo.job.sizes"),       # not float32s
    (["job.sizes=[0]"], "job.sizes"),
    (["job.sizes=[big]"], "job.sizes"),
    (["job.epoch_steps=2"], "job.sizes"),
    (["job.workers=1"], "job.workers"),
])
def test_bad_sweep_input_names_the_field(sets, field):
    with pytest.raises(ScenarioError) as err:
        run.check_input("allreduce-sweep", sets=sets)
    assert err.value.field == field, str(err.value)


def test_the_sweep_scenario_validates():
    given = run.check_input("allreduce-sweep")
    assert given.params["job"]["sizes"][0] == 64 * 1024
    assert given.params["job"]["sizes"][-1] == 16 * 1024 * 1024


def _rank(times: dict[int, list[float]]) -> dict:
    steps, k = [], 0
    for size, ts in times.items():
        for i, t in enumerate(ts):
            steps.append({"step": k, "epoch": 0, "warmup": i == 0, "size_bytes": size,
                          "t_start": float(k), "t_end": k + t, "t_comm_start": float(k),
                          "step_s": t, "comm_s": t, "compute_s": 0.0, "idle_s": t})
            k += 1
    return {"steps": steps}


def test_sweep_rows_follow_nccl_tests():
    """time = median of the measured steps; algbw = S/t; busbw = algbw·2(N−1)/N."""
    outputs = [_rank({1 << 16: [9.0, 0.1, 0.3, 0.2], 1 << 20: [9.0, 0.4, 0.4]})
               for _ in range(4)]
    rows = jm.sweep_rows(outputs, 4, 50e6)
    assert [r["size_bytes"] for r in rows] == [1 << 16, 1 << 20]
    small, big = rows
    assert small["steps"] == 3 and small["time_s"] == pytest.approx(0.2)
    assert small["count"] == (1 << 16) // 4
    assert big["algbw_bps"] == pytest.approx((1 << 20) * 8 / 0.4, rel=1e-6)
    assert big["busbw_bps"] == pytest.approx(big["algbw_bps"] * 1.5, rel=1e-6)
    # the ideal is TCP's payload on the wire: 1448 of every 1538 bytes (full frames)
    ceiling = 50e6 * 1448 / 1538
    assert big["ideal_time_s"] == pytest.approx(1.5 * (1 << 20) * 8 / ceiling, rel=1e-6)
    assert big["ideal_busbw_bps"] == round(ceiling)
    assert big["busbw_vs_ideal"] == pytest.approx(big["busbw_bps"] / ceiling, abs=1e-4)
    lines = jm.sweep_table(rows)
    assert len(lines) == 3 and lines[2].split()[0] == str(1 << 20)
    # The headline numbers are the largest size's.
    mt = jm.ring_metrics(outputs, 4, 1 << 20, 50e6, [])
    assert mt["comm_p50_s"] == pytest.approx(0.4) and mt["steps"] == 2
