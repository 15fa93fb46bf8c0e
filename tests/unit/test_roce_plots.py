"""The roce kind's plots from hand-made phases: the pause tree's ports in order from the root
upstream, each QP's rate on the phase's clock, a phase without congestion control or PFC
left out with its reason, and every plot drawn with its words on it."""

from __future__ import annotations

from pathlib import Path

from lab.kinds.roce import plots
from lab.plotting.plots import Skipped, Spec
from lab.plotting.sections import sections
from lab.report.draw import draw_spec

#: A pause tree as metrics.pause_tree writes it: one root (never paused), a hop-1 port
#: paused less than its sibling, a port paused but reached from no root.
TREE = {"roots": ["leaf1-eth1"],
        "hops": {"leaf1-eth1": 0, "spine1-eth1": 1, "h2-eth0": 1, "leaf2-eth5": 2},
        "paused_ns": {"spine1-eth1": 1_000_000_000, "h2-eth0": 2_500_000_000,
                      "leaf2-eth5": 500_000_000, "spine9-eth4": 7_000_000},
        "max_hops": 2}

LINKS = [{"node": "leaf1", "intf": "leaf1-eth1", "peer": "h1"},
         {"node": "leaf1", "intf": "leaf1-eth2", "peer": "h2"},
         {"node": "spine1", "intf": "spine1-eth1", "peer": "leaf1"}]


def qp(duration_s: float, cc: str, samples: list[list[float]], cnps: int = 0) -> dict:
    """One QP's transport output as roce_bw writes it (what the plots read of it)."""
    return {"config": {"duration_s": duration_s, "cc": cc, "rate_mbps": 25},
            "goodput_mbps": 20.0,
            "qps": [{"cnps_received": cnps, "dcqcn": {"cuts": cnps},
                     "rate_samples": samples}]}


def phase(cc: str, pfc: bool, tree: dict | None = None) -> dict:
    """A phase's details and metrics: an incast QP from 0 s and a victim from 2 s."""
    transport = {"incast-h5": qp(6, cc, [[0.0, 25e6, 25e6, 1.0], [0.01, 12.5e6, 25e6, 1.0]], 3),
                 "victim-h8": qp(4, cc, [[0.0, 25e6, 25e6, 1.0], [0.01, 25e6, 25e6, 1.0]])}
    groups = {"incast": {"goodput_bps": 19.5e6, "per_qp_bps": {"incast-h5": 19.5e6},
                         "vs_baseline": None},
              "victim": {"goodput_bps": 7.5e6, "per_qp_bps": {"victim-h8": 7.5e6},
                         "vs_baseline": 0.33}}
    return {"details": {"duration_s": 6.5, "links": LINKS, "flows": [],
                        "transport": transport, "pfc": {"ports": [
                            {"dev": "leaf1-eth1",
                             "priorities": {"3": {"pause_frames_tx": 42}}}]}},
            "metrics": {"cc": cc, "pfc": pfc, "groups": groups, "lossless_drops": 0,
                        "pause_tree": tree or {"roots": [], "hops": {}, "paused_ns": {}}}}


def run(**phases: dict) -> dict:
    """A result with these phases, ``alone`` its baseline."""
    return {"kind": "roce",
            "phase_details": {n: p["details"] for n, p in phases.items()},
            "metrics": {"baseline": "alone", "phases": {n: p["metrics"]
                                                          for n, p in phases.items()}}}


def test_ports_ordered_from_the_root_upstream() -> None:
    order = [(p.dev, p.hop, p.paused_s, p.root) for p in plots.ports_by_hops(TREE)]
    assert order == [("leaf1-eth1", 0, 0.0, True),
                     ("h2-eth0", 1, 2.5, False), ("spine1-eth1", 1, 1.0, False),
                     ("leaf2-eth5", 2, 0.5, False),
                     ("spine9-eth4", None, 0.007, False)]
    assert plots.ports_by_hops({}) == []


def test_port_labels_name_both_ends() -> None:
    assert plots.port_label("leaf1-eth1", LINKS) == "leaf1-eth1 (leaf1→h1)"
    assert plots.port_label("h2-eth0", LINKS) == "h2-eth0 (h2→leaf1)"   # its switch's port
    assert plots.port_label("h7-eth0", LINKS) == "h7-eth0"              # nothing faces it


def test_a_later_qp_starts_later_on_the_phase_clock() -> None:
    sec = sections(run(dcqcn=phase("dcqcn", True)))[0]
    rates = {r.qp: r for r in plots.qp_rates(sec)}
    assert rates["incast-h5"].t_s == [0.0, 0.01] and rates["incast-h5"].group == "incast"
    assert rates["victim-h8"].t_s == [2.0, 2.01] and rates["victim-h8"].start_s == 2.0
    assert rates["incast-h5"].rc_mbps == [25.0, 12.5] and rates["incast-h5"].cnps == 3


def test_phases_without_their_data_say_why() -> None:
    secs = sections(run(alone=phase("none", False)))
    rate, tree = plots.section_plots(secs[0], None)
    assert isinstance(rate, Skipped) and "no congestion control" in rate.reason
    assert "25 Mbit/s" in rate.reason
    assert isinstance(tree, Skipped) and "PFC was off" in tree.reason


def test_every_plot_is_drawn_with_its_words(tmp_path: Path) -> None:
    result = run(alone=phase("none", False), dcqcn=phase("dcqcn", True, TREE))
    secs = sections(result)
    made = [*plots.run_plots(result, secs), *plots.section_plots(secs[1], None)]
    assert all(isinstance(s, Spec) for s in made), made
    drawn = {p.kind: p for p in (draw_spec(s, tmp_path) for s in made if isinstance(s, Spec))}
    assert set(drawn) == {"group-goodput", "dcqcn-rate", "pause-tree"}
    assert (tmp_path / "pause-tree-dcqcn.png").stat().st_size > 10_000
    tree = drawn["pause-tree"]
    assert tree.title.startswith("PFC pause tree") and tree.xlabel.endswith("(s)")
    assert "leaf1-eth1 (leaf1→h1) (42 PAUSE frames)" in tree.caption
    assert "reaching 2 hops" in tree.caption
    rate = drawn["dcqcn-rate"]
    assert rate.ylabel == "sending rate RC (Mbit/s)"
    assert "incast-h5 (incast): 3 CNPs, goodput 20.0 Mbit/s" in rate.legend
    goodput = drawn["group-goodput"]
    assert goodput.title == "Goodput per group, phase by phase (% of phase alone)"
    assert "dcqcn: incast 19.5, victim 7.5 (33 %)" in goodput.caption
