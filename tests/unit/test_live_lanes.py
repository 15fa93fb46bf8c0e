"""The live view's lanes without a fabric: the feed keeps them per phase, a viewer's live file
becomes a lane's spans, and the poller hands the files there are to the feed.

The viewers' own live files on real streams are checked in test_rtmpview.py and
test_hlsview.py; the page on a real run in tests/integration/test_live_streams.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from lab.agents.common import LiveFile, live_state
from lab.kinds.streaming import liveview
from lab.measure import live


def test_lanes_are_the_phase_s_and_its_steps_keep_them() -> None:
    clock = [500.0]
    feed = live.Feed(clock=lambda: clock[0])
    feed.set_phase("incident")
    seq = feed.state()["phase_seq"]
    lane = live.Lane("rtmp:a", "a RTMP", (("waiting", 501.0, 502.5), ("playing", 502.5, 504.0),
                                          ("stalled", 504.0, None)), asof=505.0)
    feed.set_lanes([lane])
    clock[0] = 506.0
    st = feed.state()
    # Times on the phase's clock: seconds since it began; a span still on stays open.
    assert st["lane_t"] == 6.0 and st["phase_seq"] == seq
    assert st["lanes"] == [{"id": "rtmp:a", "label": "a RTMP", "asof": 5.0,
                            "spans": [["waiting", 1.0, 2.5], ["playing", 2.5, 4.0],
                                      ["stalled", 4.0, None]]}]
    # A step of the phase: the label changes, the phase's clock and lanes do not.
    clock[0] = 507.0
    feed.set_phase("incident", "draining")
    st = feed.state()
    assert (st["phase"], st["phase_t"], st["lane_t"]) == ("incident: draining", 0.0, 7.0)
    assert st["phase_seq"] == seq and len(st["lanes"]) == 1
    # The next phase: a clock from zero, no lanes until its own are set.
    feed.set_phase("fix-hash")
    st = feed.state()
    assert (st["lanes"], st["lane_t"], st["phase_seq"]) == ([], 0.0, seq + 1)
    feed.set_lanes([lane])
    assert feed.state()["lanes"][0]["spans"][0] == ["waiting", -6.0, -4.5]


def test_a_live_file_says_only_what_has_happened() -> None:
    # The model's answer at now = t0 + 6: picture at 1.5 s, a stall 3-4 s, one from 5.5 s that
    # the model ends at the watch's end (still on), and one it placed after now (cut).
    doc = live_state(agent="rtmpview", stream_id=3, t0=100.0, now=106.0, startup_delay_s=1.5,
                     stalls=[(3.0, 4.0), (5.5, None), (7.0, 8.0)])
    assert (doc["state"], doc["first_picture"], doc["stall_count"]) == ("stalled", 101.5, 2)
    assert doc["stalls"] == [[103.0, 104.0], [105.5, None]] and doc["clock"] == \
        "CLOCK_MONOTONIC"
    assert liveview.spans_of(doc) == (("waiting", 100.0, 101.5), ("playing", 101.5, 103.0),
                                      ("stalled", 103.0, 104.0), ("playing", 104.0, 105.5),
                                      ("stalled", 105.5, None))
    waiting = live_state(agent="hlsview", stream_id=3, t0=100.0, now=101.0,
                         startup_delay_s=1.0 + 1e-3, stalls=[])
    assert waiting["state"] == "waiting" and liveview.spans_of(waiting) == \
        (("waiting", 100.0, None),)
    ended = live_state(agent="hlsview", stream_id=3, t0=100.0, now=110.0, startup_delay_s=2.0,
                       stalls=[(4.0, 5.0)], ended_s=9.0, final=True)
    assert (ended["state"], ended["ended"], ended["final"]) == ("ended", 109.0, True)
    assert liveview.spans_of(ended)[-1] == ("playing", 105.0, 109.0)


def test_a_live_file_is_written_whole_and_not_too_often(tmp_path: Path) -> None:
    path = tmp_path / "v.live.json"
    lf = LiveFile(str(path), every_s=0.5)
    assert lf.due(10.0) and lf.wait_s(10.0, 3.0) == 0.0
    lf.write({"n": 1}, 10.0)
    assert not lf.due(10.4) and lf.wait_s(10.25, 3.0) == 0.25 and lf.due(10.5)
    assert json.loads(path.read_text()) == {"n": 1} and list(tmp_path.iterdir()) == [path]
    gone = LiveFile(str(tmp_path / "no-such-dir" / "v.live.json"))
    gone.write({"n": 1}, 10.0)  # not raised: a live view must not end the watch
    assert (gone.writes, gone.failures, gone.due(10.1)) == (0, 1, False)
    off = LiveFile(None)
    assert not off.due(10.0) and off.wait_s(10.0, 3.0) == 3.0
    off.write({"n": 1}, 10.0)
    assert off.writes == 0 and lf.writes == 1


def test_the_poller_publishes_the_files_there_are(tmp_path: Path) -> None:
    clock = [50.0]
    feed = live.Feed(clock=lambda: clock[0])
    feed.set_phase("incident")
    files = [("rtmp:a", "a RTMP", tmp_path / "1.view.live.json"),
             ("hls:a", "a HLS", tmp_path / "1.hls.live.json"),
             ("rtmp:b", "b RTMP", tmp_path / "2.view.live.json")]
    (tmp_path / "1.view.live.json").write_text(json.dumps(live_state(
        agent="rtmpview", stream_id=1, t0=50.5, now=53.0, startup_delay_s=1.0,
        stalls=[(2.0, None)])))
    (tmp_path / "1.hls.live.json").write_text("{")  # a reader must never see this; skipped
    poller = live.LanePoller(feed, lambda: liveview.read_lanes(files))
    poller.start()
    poller.stop()
    assert poller.polls >= 1
    [lane] = feed.state()["lanes"]
    assert (lane["id"], lane["asof"]) == ("rtmp:a", 3.0)
    assert lane["spans"] == [["waiting", 0.5, 1.5], ["playing", 1.5, 2.5], ["stalled", 2.5, None]]

