"""Reports from real runs: PNGs that are plots, and an HTML page that renders with no network.

The page is rendered by headless Chromium inside a network namespace of its own (``unshare
--net``), so anything it tried to fetch would be missing; the page's own script counts the
images that decoded into ``data-plots``, and the screenshot must show a page, not white.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from PIL import Image

from lab.report import compare_rows, load_result, write_compare, write_report
from tests.integration.support import fabriclab

CHROMIUM = shutil.which("chromium-headless-shell")


#: The run of ``ecmp-basic`` the report modules share (``shared_run``).
ECMP_RUN = ("ecmp-basic", "--policy", "hash5", "--duration", "3")
#: The run they compare it with.
L3_RUN = ("ecmp-basic", "--policy", "hash-l3", "--duration", "3")


@pytest.fixture(scope="module")
def hash5_run(shared_run) -> Path:
    return shared_run(*ECMP_RUN)


def render(page: Path, tmp: Path) -> tuple[Image.Image, str]:
    """Screenshot and DOM of ``page`` from headless Chromium with no network at all."""
    if CHROMIUM is None:
        pytest.skip("chromium-headless-shell is not installed (apt install "
                    "chromium-headless-shell)")
    shot = tmp / f"{page.stem}-shot.png"
    base = ["unshare", "--net", CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
            f"--user-data-dir={tmp / 'chromium-profile'}", "--window-size=1280,4000"]
    subprocess.run([*base, f"--screenshot={shot}", page.as_uri()], check=True,
                   capture_output=True, timeout=120)
    dom = subprocess.run([*base, "--dump-dom", page.as_uri()], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    return Image.open(shot), dom


def dark_share(im: Image.Image) -> float:
    """The share of pixels that are not (near) white."""
    hist = im.convert("L").histogram()
    return sum(hist[:235]) / sum(hist)


def files_of(d: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in d.rglob("*") if p.is_file()}


def assert_not_blank(shot: Image.Image) -> None:
    assert shot.format == "PNG" and shot.size == (1280, 4000), (shot.format, shot.size)
    rgb = shot.convert("RGB")
    non_white = dark_share(rgb)
    colours = len(rgb.getcolors(maxcolors=1 << 20) or [])
    # Text and tables are grey; saturated pixels in the first 4000 px are the plots.
    saturation = rgb.convert("HSV").getchannel("S").histogram()
    colourful = sum(saturation[80:]) / sum(saturation)
    assert non_white > 0.05, f"screenshot nearly white: {non_white:.3f} non-white"
    assert colours > 500, f"screenshot has only {colours} colours"
    assert colourful > 0.02, f"no plot in view: {colourful:.4f} of the pixels in colour"


def assert_self_contained(text: str) -> None:
    """Every src/href is an embedded PNG or an anchor on the page; nothing is fetched."""
    refs = re.findall(r"""(?:src|href)\s*=\s*["']?([^"'\s>]*)""", text, flags=re.I)
    assert refs, "no src/href at all: no images?"
    bad = [r for r in refs if not (r.startswith("data:image/png;base64,") or r.startswith("#"))]
    assert not bad, bad[:5]
    assert not re.search(r"(?:src|href)\s*=\s*[\"']?\s*(?:https?:)?//", text, flags=re.I)
    assert "url(" not in text and "@import" not in text
    assert not re.search(r"<(?:link|iframe|object|embed)\b", text, flags=re.I)
    assert not re.search(r"<script[^>]*\bsrc=", text, flags=re.I)


def test_report_of_a_real_run(hash5_run, tmp_path):
    t0 = time.monotonic()
    page = write_report(hash5_run)
    made_s = time.monotonic() - t0
    assert page == hash5_run / "report.html"
    index = json.loads((hash5_run / "plots" / "index.json").read_text())
    plots = index["plots"]
    names = {p["name"] for p in plots}
    # 16 links (> 8): a heatmap with a colour bar; 8 flows with an offered rate each.
    assert {"weathermap", "util", "goodput"} <= names, index
    assert names | {s["name"] for s in index["skipped"]} == {"weathermap", "util", "queue",
                                                             "goodput"}
    for p in plots:
        png = hash5_run / "plots" / p["file"]
        assert png.stat().st_size > 5000, p
        with Image.open(png) as im:
            im.verify()
        with Image.open(png) as im:
            assert im.format == "PNG"
            assert 780 <= im.width <= 820 and 300 <= im.height <= 1300, (p["file"], im.size)
            assert im.text.get("Title") == p["title"]
            assert dark_share(im) > 0.02, p["file"]
        assert p["title"] and p["xlabel"] and p["ylabel"], p
        assert re.search(r"\(.+\)", p["ylabel"] + p["colorbar"]), p     # a unit
        assert "(s)" in p["xlabel"] or p["kind"] in ("goodput", "weathermap"), p
        assert p["legend"] or p["colorbar"], p
        assert p["caption"].strip().endswith("."), p
    util = next(p for p in plots if p["name"] == "util")
    assert util["colorbar"] == "utilisation (% of link rate)"
    goodput = next(p for p in plots if p["name"] == "goodput")
    assert goodput["legend"] == ["offered", "goodput"]

    text = page.read_text()
    assert_self_contained(text)
    assert text.count("<img ") == len(plots)
    for p in plots:
        assert f'alt="{html.escape(p["title"])}"' in text
        assert html.escape(p["caption"]) in text
    r = load_result(hash5_run)
    for words in ("ecmp-basic", "policy hash5", f"seed {r['seed']}", r["environment"]["kernel"],
                  r["environment"]["controller"], "Fidelity", "leaf1→spine1", "retransmits"):
        assert html.escape(words) in text, words
    for f in r["flows"]:
        assert html.escape(" → ".join(f["path"])) in text

    shot, dom = render(page, tmp_path)
    assert_not_blank(shot)
    assert f'data-plots="{len(plots)}"' in dom, re.search(r"<body[^>]*>", dom)
    print(f"report: {len(plots)} plots in {made_s:.2f} s; skipped {index['skipped']}")


def test_compare_two_policies(hash5_run, shared_run, tmp_path):
    l3_run = shared_run(*L3_RUN)
    before = [files_of(hash5_run), files_of(l3_run)]
    t0 = time.monotonic()
    page = write_compare(hash5_run, l3_run, tmp_path / "cmp")
    made_s = time.monotonic() - t0
    assert page == tmp_path / "cmp" / "compare.html"
    assert [files_of(hash5_run), files_of(l3_run)] == before     # the runs are only read
    text = page.read_text()
    assert_self_contained(text)
    assert "A: hash5" in text and "B: hash-l3" in text
    rows = compare_rows(load_result(hash5_run), load_result(l3_run))
    metrics = {m: (a, b, d) for m, a, b, d in rows}
    assert "aggregate_goodput_bps" in metrics and "flows.retransmits (sum)" in metrics
    a, b, d = metrics["aggregate_goodput_bps"]
    assert a.endswith("Mbit/s") and b.endswith("Mbit/s") and d
    for row in rows:
        assert f"<td>{html.escape(row[0])}</td>" in text
    images = text.count("<img ")
    assert images >= 4, images                     # util and goodput for each run at least
    shot, dom = render(page, tmp_path)
    assert_not_blank(shot)
    assert f'data-plots="{images}"' in dom, re.search(r"<body[^>]*>", dom)
    print(f"compare: {images} plots, {len(rows)} metric rows in {made_s:.2f} s")


def test_report_and_compare_commands(hash5_run, tmp_path):
    """`fabriclab report DIR` regenerates; `fabriclab compare A B` prints the table too."""
    (hash5_run / "report.html").unlink()
    r = fabriclab("report", str(hash5_run))
    assert r.stdout.strip() == str(hash5_run / "report.html")
    assert (hash5_run / "report.html").is_file()
    out = tmp_path / "c.html"
    r = fabriclab("compare", str(hash5_run), str(hash5_run), "--out", str(out))
    assert out.is_file() and r.stdout.strip().endswith(str(out))
    head = r.stdout.splitlines()[0].split()
    assert head[:3] == ["metric", "A", "(hash5)"]
    assert any(line.startswith("imbalance ") for line in r.stdout.splitlines())
    r = fabriclab("report", str(tmp_path / "nothing-here"), check=False)
    assert r.returncode == 2 and r.stderr.startswith("fabriclab: error: ")
