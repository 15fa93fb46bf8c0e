"""The roce kind's own plots in the report of a real pfc-hol run, and in a compare.

The run is the one ``test_pfc_hol`` checks (``shared_run``); ``fabriclab report`` draws it
again. Each plot is checked against the result's own numbers, not against the plot's reading
of them: the groups' goodput and share of the baseline, each QP's CNPs, the pause tree's
root, hops and summed paused time.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from tests.integration.support import fabriclab, result_of

#: The plots the kind adds to this run, and the phase each is drawn under ("": the run's).
OWN = {"group-goodput": "", "dcqcn-rate-dcqcn": "dcqcn", "pause-tree-pfc": "pfc",
       "pause-tree-dcqcn": "dcqcn"}
#: The ones left out, with the reason's words: no congestion control, or no PFC.
LEFT_OUT = {"dcqcn-rate-alone": "no congestion control", "dcqcn-rate-lossy":
            "no congestion control", "dcqcn-rate-pfc": "no congestion control",
            "pause-tree-alone": "PFC was off", "pause-tree-lossy": "PFC was off"}


@pytest.fixture(scope="module")
def hol_run(shared_run) -> Path:
    return shared_run("pfc-hol")


@pytest.fixture(scope="module")
def index(hol_run: Path) -> dict:
    """The report made by the command, and its plots' index."""
    r = fabriclab("report", str(hol_run))
    assert r.stdout.strip() == str(hol_run / "report.html")
    return json.loads((hol_run / "plots" / "index.json").read_text())


def test_the_kinds_plots_are_on_the_page(hol_run: Path, index: dict) -> None:
    plots = {p["name"]: p for p in index["plots"]}
    assert set(OWN) <= set(plots), sorted(plots)
    skipped = {s["name"]: s["reason"] for s in index["skipped"]}
    for name, words in LEFT_OUT.items():
        assert words in skipped.get(name, ""), (name, skipped.get(name))
    text = (hol_run / "report.html").read_text()
    for name, section in OWN.items():
        p = plots[name]
        assert p["section"] == section, p
        assert (hol_run / "plots" / p["file"]).stat().st_size > 20_000, p
        assert p["title"] and any(unit in p["xlabel"] + p["ylabel"]
                                  for unit in ("(s)", "(Mbit/s)")), p
        assert f"id='plot-{name}'" in text and html.escape(p["title"]) in text, name
        if section:     # under its phase's heading, after the plots every phase gets
            at = text.index(f"id='plot-{name}'")
            assert text.rfind("<h3>Phase ", 0, at) == text.index(f"<h3>Phase {section}</h3>")
            assert text.index(f"id='plot-goodput-{section}'") < at


def test_goodput_per_group_is_the_lessons_table(hol_run: Path, index: dict) -> None:
    r = result_of(hol_run)
    plot = next(p for p in index["plots"] if p["name"] == "group-goodput")
    base = r["metrics"]["baseline"]
    assert plot["title"] == f"Goodput per group, phase by phase (% of phase {base})"
    for name, m in r["metrics"]["phases"].items():
        victim = m["groups"]["victim"]
        assert (f"victim {victim['goodput_bps'] / 1e6:.1f} "
                f"({100 * victim['vs_baseline']:.0f} %)") in plot["caption"], name


def test_dcqcn_rate_names_each_qps_cnps(hol_run: Path, index: dict) -> None:
    transport = result_of(hol_run)["phase_details"]["dcqcn"]["transport"]
    plot = next(p for p in index["plots"] if p["name"] == "dcqcn-rate-dcqcn")
    assert plot["ylabel"] == "sending rate RC (Mbit/s)" and plot["xlabel"].endswith("(s)")
    for qp, out in transport.items():
        cnps = out["qps"][0]["cnps_received"]
        assert any(e.startswith(f"{qp} (") and f": {cnps} CNPs," in e
                   for e in plot["legend"]), (qp, plot["legend"])
    assert sum(o["qps"][0]["cnps_received"] for o in transport.values()) > 0


@pytest.mark.parametrize("phase", ["pfc", "dcqcn"])
def test_pause_tree_from_the_root_upstream(hol_run: Path, index: dict, phase: str) -> None:
    m = result_of(hol_run)["metrics"]["phases"][phase]
    tree = m["pause_tree"]
    plot = next(p for p in index["plots"] if p["name"] == f"pause-tree-{phase}")
    assert plot["legend"][0] == "hop 0: root, the congested port"
    assert plot["legend"][1:] == [f"hop {h}" for h in range(1, tree["max_hops"] + 1)]
    assert f"Roots: {tree['roots'][0]} (" in plot["caption"]
    assert f"{sum(tree['paused_ns'].values()) / 1e9:.2f} s paused in all" in plot["caption"]
    assert f"reaching {tree['max_hops']} hops" in plot["caption"]


def test_compare_draws_the_kinds_plots_in_pairs(hol_run: Path, index: dict,
                                                tmp_path: Path) -> None:
    """`fabriclab compare` of a roce run with itself: every own plot on both sides."""
    out = tmp_path / "compare.html"
    fabriclab("compare", str(hol_run), str(hol_run), "--out", str(out))
    text = out.read_text()
    for name in OWN:
        assert text.count(f"id='plot-{name}'") == 2, name


def test_the_weathermap_marks_the_paused_ports(hol_run: Path, index: dict) -> None:
    """Phase pfc's weathermap names PFC's paused ports with their seconds, the longest
    first, as pfcd counted them; phase alone's (no PFC) names none."""
    plots = {p["name"]: p for p in index["plots"]}
    details = result_of(hol_run)["phase_details"]
    prio = {p["dev"]: p["priorities"]["3"] for p in details["pfc"]["pfc"]["ports"]}
    paused = [c["paused_ns"] / 1e9 for c in prio.values() if c["pause_frames_rx"]]
    caption = plots["weathermap-pfc"]["caption"]
    assert f"PFC paused {len(paused)} ports' lossless class" in caption
    assert f"{max(paused):.2f} s" in caption
    assert "PFC paused" not in plots["weathermap-alone"]["caption"]
