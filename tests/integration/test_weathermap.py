"""The weathermap in the reports of real runs of every kind, per phase, and in a compare.

The hottest link is checked against the counters themselves (bytes sent over link rate),
not against the map's own reading of them; an old result.json (nothing but the file) gets
its map from `fabriclab report`; the page renders in headless Chromium with no network.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import time
from pathlib import Path

import pytest

from lab.plotting.plots import UTIL_LABEL
from lab.report import load_result, write_compare, write_report
from tests.integration.support import fabriclab
from tests.integration.test_report import (
    ECMP_RUN,
    L3_RUN,
    assert_not_blank,
    assert_self_contained,
    render,
)

#: The phases each kind's map is drawn for ("" is an unphased run).
PHASES = {"ecmp": [""], "collective": ["hashed", "placed"],
          "streaming": ["before-upgrade", "incident"]}


@pytest.fixture(scope="module")
def ecmp(shared_run) -> Path:
    return shared_run(*ECMP_RUN)


@pytest.fixture(scope="module")
def collective(shared_run) -> Path:
    return shared_run("allreduce-ecmp")


@pytest.fixture(scope="module")
def streaming(shared_run) -> Path:
    """Two of the incident's phases: the page with the tallest maps, still rendered whole
    by one screenshot (the six phases' report is longer than it)."""
    return shared_run("streaming-incident", "--set", "phases=before-upgrade,incident")


def section_links(result: dict, phase: str) -> list[dict]:
    return result["phase_details"][phase]["links"] if phase else result["links"]


def hottest_by_counters(result: dict, phase: str) -> set[str]:
    """``node→peer`` (with ``(cable k)`` where the pair has parallel cables) of the egress
    ports that sent the most bytes for their rate (more than one when tied): every port of a
    section is counted over the same window, so these have the highest mean utilisation."""
    links = section_links(result, phase)
    most = max(ln["tx_bytes"] / ln["bw_mbps"] for ln in links)
    return {link_name(result, ln) for ln in links if ln["tx_bytes"] / ln["bw_mbps"] == most}


def link_name(result: dict, top: dict) -> str:
    topo = result["topology"]
    pair = {top["node"], top["peer"]}
    cables = [c for c in topo["links"] + topo.get("router_links", []) if {c["a"], c["b"]} == pair]
    name = f"{top['node']}→{top['peer']}"
    if len(cables) > 1:
        k = next(i for i, c in enumerate(cables)
                 if (c["a"], c["a_port"]) == (top["node"], top["port"])
                 or (c["b"], c["b_port"]) == (top["node"], top["port"]))
        name += f" (cable {k + 1})"
    return name


def assert_hottest(caption: str, hot: set[str]) -> None:
    """The caption names one of the hottest links as the hottest, and the others as tied."""
    named = [n for n in hot if f"Hottest: {n} at " in caption]
    assert len(named) == 1, (hot, caption)
    for n in hot - set(named):
        assert re.search(r"\(as hot: [^.]*" + re.escape(n), caption), (n, caption)
    if len(hot) == 1:
        assert "as hot:" not in caption, caption


@pytest.mark.parametrize("kind", list(PHASES))
def test_weathermap_in_every_kinds_report(kind, request, tmp_path):
    run = request.getfixturevalue(kind)
    t0 = time.monotonic()
    page = write_report(run)
    made_s = time.monotonic() - t0
    result = load_result(run)
    index = json.loads((run / "plots" / "index.json").read_text())
    maps = [p for p in index["plots"] if p["kind"] == "weathermap"]
    assert [p["section"] for p in maps] == PHASES[kind], index["skipped"]
    text = page.read_text()
    for p in maps:
        phase = p["section"]
        assert p["name"] == ("weathermap-" + phase if phase else "weathermap")
        png = run / "plots" / p["file"]
        assert png.stat().st_size > 20_000, p
        assert p["colorbar"] == UTIL_LABEL and p["ylabel"] == "tier"
        assert "hottest link" in p["legend"], p["legend"]
        assert_hottest(p["caption"], hottest_by_counters(result, phase))
        drops = sum(ln["drops"] for ln in section_links(result, phase))
        assert (f"Drops: {drops:,} (" in p["caption"]) if drops else ("No drops." in
                                                                       p["caption"])
        assert f"id='plot-{p['name']}'" in text and html.escape(p["caption"]) in text
        flows = result["phase_details"][phase]["flows"] if phase else result["flows"]
        stalled = [f for f in flows if f.get("stalls")]
        if stalled:
            assert f"Drawn as paths: stalled streams ({len(stalled)})." in p["caption"]
        if kind == "collective":
            assert "Drawn as paths: ring epoch " in p["caption"], p["caption"]
    print(f"{kind}: {len(maps)} weathermaps, report in {made_s:.2f} s, "
          f"{page.stat().st_size / 1e6:.2f} MB; "
          + ", ".join(f"{p['file']} {(run / 'plots' / p['file']).stat().st_size // 1000} kB"
                      for p in maps))
    if kind == "streaming":          # the tallest maps: the page still renders offline
        assert_self_contained(text)
        shot, dom = render(page, tmp_path)
        assert_not_blank(shot)
        assert f'data-plots="{text.count("<img ")}"' in dom


def test_old_result_gets_its_weathermap(ecmp, tmp_path):
    """A run directory holding nothing but a result.json (no report ever made from it)."""
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(ecmp / "result.json", old / "result.json")
    assert "weathermap" not in (old / "result.json").read_text()
    r = fabriclab("report", str(old))
    assert r.stdout.strip() == str(old / "report.html")
    text = (old / "report.html").read_text()
    assert "id='plot-weathermap'" in text
    index = json.loads((old / "plots" / "index.json").read_text())
    caption = next(p["caption"] for p in index["plots"] if p["name"] == "weathermap")
    assert_hottest(caption, hottest_by_counters(load_result(old), ""))


def test_compare_draws_both_maps_on_one_scale(ecmp, shared_run, tmp_path):
    other = shared_run(*L3_RUN)
    page = write_compare(ecmp, other, tmp_path / "cmp")
    text = page.read_text()
    assert text.count("id='plot-weathermap'") == 2
    top = max(100 * ln["util_mean"] for d in (ecmp, other) for ln in load_result(d)["links"])
    scales = re.findall(r"Colour scale 0–(\d+) %", text)
    assert scales == [f"{max(100.0, top):.0f}"] * 2, scales
    for d in (ecmp, other):
        assert any(html.escape(f"Hottest: {n} at ") in text
                   for n in hottest_by_counters(load_result(d), ""))
