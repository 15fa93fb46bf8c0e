"""The gpu-wait picture's pure parts (lab.kinds.collective.gpuplot) on a small phase written
the way the collective kind writes one: ranks' step rows on their monotonic clock, the
window's start on it, links and flows. The picture from a real run is
tests/integration/test_gpu_wait_picture.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lab.kinds.collective import gpuplot
from lab.plotting.plots import Skipped, Spec
from lab.report.draw import draw_spec

T0 = 61185.9       # where the window opened on the ranks' clock


def step(n: int, t: float, parts: tuple[float, float, float, float]) -> dict[str, Any]:
    dw, c, ex, bar = parts
    return {"step": n, "warmup": n == 0, "data_wait_s": dw, "compute_s": c,
            "exposed_comm_s": ex, "barrier_s": bar, "step_s": sum(parts),
            "t_start": t, "t_end": t + sum(parts), "t_compute_end": t + dw + c}


def link(node: str, peer: str, bw: float, bps: list[float], queue: list[int],
         drops: int = 0) -> dict[str, Any]:
    return {"node": node, "peer": peer, "port": 1, "intf": f"{node}-{peer}", "bw_mbps": bw,
            "drops": drops, "series": {"t": [0.04 * i for i in range(len(bps))],
                                       "tx_bps": bps, "queue_bytes": queue}}


def phase() -> dict[str, Any]:
    ranks = [{"rank": r, "steps": [step(0, T0 + 0.5, (0.2, 0.1, 0.05, 0.01)),
                                   step(1, T0 + 0.86, (0.0, 0.1, 0.07, 0.0))],
              "loader": {}} for r in range(2)]
    links = [link("leaf1", "h1", 50, [0, 25e6, 50e6, 10e6], [0, 0, 130_000, 0], drops=3),
             link("leaf1", "h2", 50, [0, 5e6, 5e6, 0], [0, 0, 0, 0]),
             link("leaf2", "h5", 2, [0, 1e5, 1e5, 0], [0, 0, 0, 0]),
             link("spine1", "leaf2", 100, [0, 1e6, 0, 0], [0, 0, 0, 0]),
             link("leaf1", "spine1", 100, [0, 1e5, 1e5, 0], [0, 0, 0, 0]),
             link("leaf1", "spine2", 100, [0, 9e7, 9e7, 0], [0, 0, 0, 0])]
    flows = [{"kind": "allreduce", "src": "h1", "dst": "h2", "path": ["leaf1"],
              "reverse_path": ["leaf1"]},
             {"kind": "loader", "src": "h5", "dst": "h1", "path": ["leaf2", "spine1", "leaf1"],
              "reverse_path": ["leaf1", "spine1", "leaf2"]},
             {"kind": "checkpoint", "src": "h1", "dst": "h4", "path": ["leaf1", "spine2"],
              "reverse_path": ["spine2", "leaf1"]}]
    return {"duration_s": 1.2, "t_window_start": T0, "links": links, "flows": flows,
            "gpu_wait": {"ranks": ranks}}


def result(details: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "collective", "params": {"topology": {"queue_bytes": 150_000}},
            "phase_details": {"cpu": details},
            "diagnosis": {"gpu_wait": {"cpu": {"named": ["cpu"], "causes": [
                {"cause": "cpu", "share_of_step": 0.41}], "storage_links": [
                {"host": "h5", "bw_mbps": 2, "util": 0.84}]}}}}


def test_a_rank_s_parts_are_spans_on_the_window_s_clock() -> None:
    [(rank, spans), _] = gpuplot.rank_spans(phase())
    assert rank == 0
    got = [(k, round(a, 6), round(b, 6), w) for k, a, b, w in spans]
    assert got == [("data_wait_s", 0.5, 0.7, True), ("compute_s", 0.7, 0.8, True),
                   ("exposed_comm_s", 0.8, 0.85, True), ("barrier_s", 0.85, 0.86, True),
                   ("data_wait_s", 0.86, 0.86, False), ("compute_s", 0.86, 0.96, False),
                   ("exposed_comm_s", 0.96, 1.03, False), ("barrier_s", 1.03, 1.03, False)]


def test_the_links_are_the_ports_the_job_s_flows_crossed_either_way() -> None:
    d = phase()
    used = {(ln["node"], ln["peer"]) for ln in gpuplot.job_links(d["links"], d["flows"])}
    # leaf1→h2 and leaf1→h1 (the ring; a batch's last hop), leaf1→spine1, spine1→leaf2 and
    # leaf2→h5 (the loader's requests); not leaf1→spine2, the checkpoint's alone.
    assert used == {("leaf1", "h1"), ("leaf1", "h2"), ("leaf2", "h5"), ("spine1", "leaf2"),
                    ("leaf1", "spine1")}
    rows = gpuplot.link_rows(gpuplot.job_links(d["links"], d["flows"]), 150_000)
    top = rows[0]
    assert top["label"] == "leaf1→h1" and top["drops"] == 3
    assert top["util"] == pytest.approx([0, 50, 100, 20])
    assert top["full"] == pytest.approx([0.08])     # 130 kB of 150 kB: near full
    assert all(not r["full"] for r in rows[1:])


def test_a_phase_without_the_window_s_start_is_skipped_with_the_reason() -> None:
    d = phase()
    del d["t_window_start"]
    made = gpuplot.timeline_specs(result(d))
    assert len(made) == 1 and isinstance(made[0], Skipped)
    assert "t_window_start" in made[0].reason


def test_the_figure_names_the_causes_and_the_storage_host(tmp_path: Path) -> None:
    [spec] = gpuplot.timeline_specs(result(phase()))
    assert isinstance(spec, Spec)
    plot = draw_spec(spec, tmp_path)
    assert plot.title.endswith("cpu (41 % of the step)"), plot.title
    assert plot.legend == [label for _, label, _ in gpuplot.PARTS]
    assert "leaf1→h1" in plot.caption and "Diagnosis: cpu (41 % of the step)." in plot.caption
    assert (tmp_path / plot.file).stat().st_size > 10_000
