"""`fabriclab run streaming-incident --live`: the page shows each real viewer's lane (waiting,
playing, stalled) under the uplinks' utilisation, on the phase's clock, from a real run.

One run of the incident phase alone (real media: ffmpeg, nginx-rtmp, the lab's RTMP and HLS
viewers), watched from headless Chromium in a network namespace of its own as
``test_live.py`` watches its run. The page's own drawing is read a few times a second: each
uplink series' point count, each lane and the stall intervals it drew, and compared with
what the run wrote in result.json afterwards.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from lab.kinds.streaming import media
from lab.net import frr
from tests.integration.netns_browser import CHROMIUM, live_pages, live_port
from tests.integration.support import BUSY, RunWatcher, retry_while_busy, valid_run

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root"),
    pytest.mark.skipif(not frr.installed(), reason="FRR is not installed (make setup)"),
    pytest.mark.skipif(bool(media.missing_packages()),
                       reason=f"real media needs {', '.join(media.missing_packages())}"),
]

#: What the test reads of the page: its state and phase, the uplinks it has bars for, each
#: uplink series of the figure with its point count, and each viewer's lane.
READ_PAGE = """JSON.stringify(document.body === null ? null : {
  state: document.body.dataset.state, phase: document.body.dataset.phase,
  lanes: +document.body.dataset.lanes,
  bars: [...document.querySelectorAll('#bars .bar')].map((e) => e.id.slice(4)),
  uplinks: Object.fromEntries([...document.querySelectorAll('#figsvg path[data-uplink]')].map(
    (e) => [e.dataset.uplink, +e.dataset.points])),
  lane: Object.fromEntries([...document.querySelectorAll('#figsvg g.lane')].map(
    (e) => [e.dataset.lane, {stalls: +e.dataset.stalls, state: e.dataset.state,
                             intervals: JSON.parse(e.dataset.stallIntervals)}]))})"""
SIZE = (1400, 1100)
#: Seconds of streaming. The hot uplink leaves the big streams about 18.5 of the 24 Mbit/s
#: they offer: at a fair share (77 % of real time) a viewer's 1 s start-up buffer, filled
#: 2-3.5 s after it joins, runs dry about 4.3 s later. At 6 s a run whose streams shared
#: fairly had no stall at all (only the share's losers stalled, 1-3 of 4); by 12 s the
#: fair share stalls too, so some viewer must.
DURATION_S = 12


def watch(out: Path) -> tuple[RunWatcher, list[dict[str, Any]]]:
    """Run the incident with --live; read the page until the run has ended."""
    run = RunWatcher("streaming-incident", "--set", "phases=incident", "--duration",
                     str(DURATION_S), "--live", "--out", str(out))
    port = live_port(run, 120)
    seen = [page for _, page in live_pages(run, port, out.parent / "profile", SIZE, READ_PAGE)]
    return run, seen


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if CHROMIUM is None:
        pytest.skip("chromium-headless-shell is not installed (apt install "
                    "chromium-headless-shell)")
    out = tmp_path_factory.mktemp("live-streams") / "run"
    t0 = time.monotonic()
    pages: list[list[dict[str, Any]]] = []

    def attempt(n: int) -> dict[str, Any]:
        if n:
            out.rename(out.with_name(f"{out.name}.cpu-bound-{n}"))
        # The run must be seen to start (its URL), so it cannot queue for the lock itself.
        run, seen = retry_while_busy(
            lambda: watch(out), lambda w: w[0].finish() != 0 and BUSY in w[0].output())
        rc = run.finish()
        assert rc == 0, run.output()
        pages.append(seen)
        return json.loads((out / "result.json").read_text())

    # The stalls it compares are a network number: only a valid run's count.
    result = valid_run(attempt, "fabriclab run streaming-incident --live")
    seen = pages[-1]
    print(f"streaming-incident watched live in {time.monotonic() - t0:.1f} s; "
          f"{len(seen)} page reads")
    assert result["metrics"]["media"] == "real", result["metrics"].get("media")
    return {"seen": seen, "result": result}


def incident(seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The page reads of the incident phase (its steps included) that showed lanes."""
    return [p for p in seen if p["state"] == "live" and p["phase"].startswith("incident")
            and p["lanes"] > 0]


def viewers(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{lane id: what that viewer reported in result.json} for the incident's streams."""
    out = {}
    for f in result["flows"]:
        if f.get("phase") != "incident":
            continue
        players = f.get("players") or {}
        for protocol in ("rtmp", "hls", "hlsjs"):
            if players.get(protocol) is not None:
                out[f"{protocol}:{f['id']}"] = players[protocol]
    return out


def test_the_uplinks_history_has_points_for_every_uplink(watched: dict[str, Any]) -> None:
    reads = incident(watched["seen"])
    assert reads, [(p["state"], p["phase"], p["lanes"]) for p in watched["seen"]]
    last = reads[-1]
    # The same uplinks as the bars, each a series with a point per poll of the phase so far.
    assert last["bars"] and sorted(last["uplinks"]) == sorted(last["bars"]), last
    assert all(n >= 2 * DURATION_S for n in last["uplinks"].values()), last["uplinks"]
    counts = [min(p["uplinks"].values()) for p in reads]
    assert counts == sorted(counts), counts            # the history grows, never restarts
    print(f"{len(last['bars'])} uplinks, points at the end: {last['uplinks']}")


def test_a_lane_per_viewer(watched: dict[str, Any]) -> None:
    want = viewers(watched["result"])
    assert any(k.startswith("rtmp:") for k in want) and any(k.startswith("hls:") for k in want)
    last = incident(watched["seen"])[-1]
    assert sorted(last["lane"]) == sorted(want), (sorted(last["lane"]), sorted(want))
    states = {lane["state"] for p in incident(watched["seen"]) for lane in p["lane"].values()}
    assert "playing" in states, states


def test_the_rtmp_stalls_on_the_page_are_the_result_s(watched: dict[str, Any]) -> None:
    """At the end of the phase the page shows each RTMP viewer's final stalls: the viewer's
    last live write is made from its summary's own model after it stopped, and the lab
    reads the files once more after the viewers have exited, before the phase ends. So the
    count must be equal, with no tolerance, and each interval as long as the summary's
    stall (to the 1 ms the page's times are rounded to, twice)."""
    want = viewers(watched["result"])
    last = incident(watched["seen"])[-1]
    rtmp = {k: v for k, v in want.items() if k.startswith("rtmp:")}
    total = 0
    for lane_id, player in rtmp.items():
        shown = last["lane"][lane_id]
        assert shown["stalls"] == player["stalls"], (lane_id, shown, player)
        durations = [b - a for a, b in shown["intervals"]]
        assert durations == pytest.approx([e["duration_s"] for e in player["stall_events"]],
                                          abs=0.003), (lane_id, shown, player)
        total += player["stalls"]
    # The incident saturates an uplink: without a stall the comparison above says little.
    assert total > 0, "no RTMP viewer stalled in the incident"
    # And a stall is on the page while the viewers still watch, not only once they are done.
    during = [p for p in incident(watched["seen"]) if p["phase"] == "incident"
              and any(lane["stalls"] for k, lane in p["lane"].items() if k in rtmp)]
    assert during, "no stall was shown before the phase's watch ended"
    print(f"RTMP stalls on the page and in result.json: "
          f"{ {k: last['lane'][k]['stalls'] for k in rtmp} } ({total} in all); "
          f"{len(during)} reads showed a stall while the viewers watched")
