"""`fabriclab run --live`: the page follows a real run in a browser that has no network, and
nothing listens once the run is over.

One run of ecmp-one-pair under hash-l3 (all eight streams on one uplink), watched from
headless Chromium in a network namespace of its own whose one way out is the page's port
(``netns_browser``). The page's own drawing is read: the stroke colour of every link and
the utilisation it drew it for, a few times a second, and a screenshot mid-traffic.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.integration.netns_browser import CHROMIUM, live_pages, live_port
from tests.integration.support import BUSY, RunWatcher, retry_while_busy

#: What the test reads of the page: its state, phase, and each link's colour and utilisation.
READ_PAGE = """JSON.stringify(document.body === null ? null : {
  state: document.body.dataset.state, phase: document.body.dataset.phase,
  updates: +document.body.dataset.updates,
  arcs: Object.fromEntries([...document.querySelectorAll('path[id^="arc-"]')].map(
    (e) => [e.id.slice(4), [e.getAttribute('stroke'), e.dataset.util]]))})"""
SIZE = (1400, 900)


def listening(port: int) -> list[str]:
    """Sockets listening on ``port`` in this namespace (``ss``)."""
    out = subprocess.run(["ss", "-Htln", f"sport = :{port}"], capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def watch(out: Path, shot: Path) -> tuple[RunWatcher, int, list[tuple[float, dict]], bool]:
    """Run with --live; read the page until it says the run ended. Returns the run, the
    port, the page's states (time, state) and whether a screenshot was taken."""
    run = RunWatcher("ecmp-one-pair", "--policy", "hash-l3", "--duration", "4", "--live",
                     "--out", str(out))
    port = live_port(run, 60)
    seen: list[tuple[float, dict]] = []
    shot_taken = False
    for browser, page in live_pages(run, port, out.parent / "profile", SIZE, READ_PAGE):
        seen.append((time.monotonic(), page))
        utils = [float(u) for _, u in page["arcs"].values() if u]
        if not shot_taken and page["phase"] == "traffic" and max(utils, default=0.0) > 0.6:
            browser.screenshot(shot)
            shot_taken = True
    return run, port, seen, shot_taken


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if CHROMIUM is None:
        pytest.skip("chromium-headless-shell is not installed (apt install "
                    "chromium-headless-shell)")
    tmp = tmp_path_factory.mktemp("live")
    t0 = time.monotonic()
    out = tmp / "run"
    # The run must be seen to start (its URL), so it cannot queue for the lock itself.
    run, port, seen, shot_taken = retry_while_busy(
        lambda: watch(out, tmp / "live.png"),
        lambda watched: watched[0].finish() != 0 and BUSY in watched[0].output())
    rc = run.finish()
    assert rc == 0, run.output()
    print(f"live run watched in {time.monotonic() - t0:.1f} s; {len(seen)} page reads")
    return {"out": out, "port": port, "seen": seen, "shot": tmp / "live.png" if shot_taken
            else None, "result": json.loads((out / "result.json").read_text()),
            "output": run.output()}


def test_the_hot_uplink_changes_colour_when_the_traffic_starts(watched: dict[str, Any]) -> None:
    r, seen = watched["result"], [p for _, p in watched["seen"]]
    assert r["fidelity"]["valid"], r["fidelity"]
    uplinks = [ln for ln in r["links"] if ln["node"].startswith("leaf")
               and ln["peer"].startswith("spine")]
    hot = max(uplinks, key=lambda ln: ln["util_mean"])
    hot_id = f"{hot['node']}:{hot['port']}"
    siblings = [f"{ln['node']}:{ln['port']}" for ln in uplinks
                if ln["node"] == hot["node"] and ln is not hot]
    assert hot["util_mean"] > 0.5 and len(siblings) == 3, uplinks

    phases = [p["phase"] for p in seen if p["state"] == "live"]
    assert "bring-up" in phases and "traffic" in phases, phases
    first_traffic = phases.index("traffic")
    assert phases.index("bring-up") < first_traffic
    before = [p for p in seen[:seen.index(next(p for p in seen if p["phase"] == "traffic"))]
              if p["state"] == "live"]
    during = [p for p in seen if p["phase"] == "traffic"]
    assert before, "the page was first read after the traffic had started"
    colour_before = before[-1]["arcs"][hot_id][0]
    hot_reads = [p for p in during if p["arcs"][hot_id][1]
                 and float(p["arcs"][hot_id][1]) > 0.7]
    assert hot_reads, [p["arcs"][hot_id] for p in during]
    for p in hot_reads:
        assert p["arcs"][hot_id][0] != colour_before, (colour_before, p["arcs"][hot_id])
        # One hot uplink beside three idle siblings: what the lesson asks to watch.
        assert all(float(p["arcs"][s][1] or 0) < 0.1 for s in siblings), p["arcs"]
    updates = [p["updates"] for p in seen if p["state"] == "live"]
    assert updates == sorted(updates) and updates[-1] > 4, updates
    print(f"{hot_id}: {colour_before} before the traffic, "
          f"{sorted({p['arcs'][hot_id][0] for p in hot_reads})} during it; "
          f"{len(hot_reads)} of {len(during)} reads in traffic above 70 %")


def test_the_screenshot_shows_the_map(watched: dict[str, Any]) -> None:
    assert watched["shot"] is not None, "no read in traffic showed a link above 60 %"
    with Image.open(watched["shot"]) as im:
        assert im.format == "PNG" and im.size == SIZE, (im.format, im.size)
        rgb = im.convert("RGB")
    # The hot end of the colour scale (viridis' yellow) on the hot uplink and its bar.
    yellow = sum(n for n, (red, green, blue) in rgb.getcolors(1 << 20) or []
                 if red > 200 and green > 200 and blue < 90)
    non_white = sum(n for n, (red, green, blue) in rgb.getcolors(1 << 20) or []
                    if min(red, green, blue) < 235)
    assert yellow > 300, f"{yellow} yellow pixels: no hot link drawn"
    assert non_white > 0.03 * SIZE[0] * SIZE[1], non_white
    print(f"screenshot {watched['shot']}: {yellow} px of the hot colour")


def test_the_page_ends_with_the_run_and_nothing_listens(watched: dict[str, Any]) -> None:
    port = watched["port"]
    assert watched["seen"][-1][1]["state"] == "ended"
    assert listening(port) == []
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert f"live view: http://127.0.0.1:{port}/" in watched["output"]
