"""The HLS viewers on real media: ``lab.agents.hlsview`` (the lab's own live HLS player) and
``lab.agents.hlsjsview`` (hls.js in headless Chromium), no mocks.

The lab's clip (``media.clip``: H.264 main without B-frames + AAC, 25 fps, a keyframe every
second) is pushed in a loop by ffmpeg (``-re``) into nginx with the RTMP module on 127.0.0.1,
configured as the lab configures a CDN node (``media.Server(role="cdn")``: HLS cut into 1 s
fragments, a 6 s playlist, served over HTTP), plus the ``/player/`` location that serves the
hls.js page. Both viewers open the stream the moment it is published, as separate processes
the way the lab starts them, and wait for three target durations of playlist before they
start (RFC 8216 §6.3.3), so start-up is about 3.5 s and the picture about 3.5 s behind.

On loopback nothing is late: neither viewer may stall, the segments must come in order with
their PTS advancing by their ``EXTINF``. A publisher SIGKILLed mid-watch must show as a stall
in both; one that comes back 3 s later as a stall from which both resume. Chromium must leave
no process behind on any way out, a SIGKILL of its agent included.

The parsers (playlist, MPEG-TS, the page's events) are also checked on their own.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from lab.agents import hlsjsview, hlsview, mpegts
from lab.agents.common import proc_stat
from lab.kinds.streaming.media import stop
from tests.unit.media_support import (
    check_live_against_summary,
    collect_live,
    free_port,
    nginx,
    until,
)

REPO = Path(__file__).resolve().parents[2]
FFMPEG = Path("/usr/bin/ffmpeg")
RTMP_MODULE = Path("/usr/lib/nginx/modules/ngx_rtmp_module.so")
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
HLSJS = Path("/var/cache/fabriclab/hlsjs/node_modules/hls.js/dist/hls.min.js")
CHROMIUM = hlsjsview.find_chromium()

_MISSING = [str(p) for p in (FFMPEG, RTMP_MODULE, Path(NGINX)) if not p.exists()]
needs_media = pytest.mark.skipif(
    bool(_MISSING), reason="needs ffmpeg and nginx with the RTMP module "
    f"(apt-get install ffmpeg nginx libnginx-mod-rtmp); missing: {', '.join(_MISSING)}")
_NO_BROWSER = [what for what, there in (
    (f"hls.js 1.7.4 at {HLSJS} (lab/setup.sh: npm install --prefix "
     "/var/cache/fabriclab/hlsjs hls.js@1.7.4)", HLSJS.exists()),
    ("chromium-headless-shell (apt-get install chromium-headless-shell)",
     shutil.which(CHROMIUM) is not None or os.access(CHROMIUM, os.X_OK))) if not there]
needs_browser = pytest.mark.skipif(bool(_NO_BROWSER),
                                   reason=f"needs {'; '.join(_NO_BROWSER)}")


def _alive_in_session(sid: int) -> list[int]:
    """Processes of session ``sid`` that still run (zombies waiting for PID 1 don't)."""
    return hlsjsview.session_pids(sid)


def _in_session(sid: int) -> list[int]:
    """Every process of session ``sid``, zombies included."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st is not None and int(st[3]) == sid:
                out.append(int(entry))
    return out


# --------------------------------------------------------------------------------------------
# The bench: the lab's clip, a CDN node, publishers
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lab.kinds.streaming import media
    return media.clip(2.0, 25, 1.0, cache=tmp_path_factory.mktemp("media"))


@pytest.fixture(scope="module")
def cdn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int, Path]]:
    """nginx configured as the lab's CDN node (the hls.js page under /player/), on free
    loopback ports: (RTMP port, HTTP port, its directory)."""
    root = tmp_path_factory.mktemp("cdn")
    with nginx(root, "cdn") as srv:
        yield srv.rtmp_port, srv.http_port, root


Publish = Callable[[str], tuple[subprocess.Popen[bytes], float, str]]


@pytest.fixture
def publish(clip: Path, cdn: tuple[int, int, Path]) -> Iterator[Publish]:
    """Start pushing the clip as stream ``name`` (again, if it was before): (process, the
    wall-clock time just before it started, the stream's playlist URL)."""
    from lab.kinds.streaming import media
    rtmp_port, http_port, root = cdn
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> tuple[subprocess.Popen[bytes], float, str]:
        log = root / "error.log"
        mark = f"publish: name='{name}'"
        before = log.read_text().count(mark)
        epoch = time.time()
        proc = subprocess.Popen(media.push_argv(clip, f"rtmp://127.0.0.1:{rtmp_port}/live/{name}"),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        started.append(proc)
        until(lambda: log.read_text().count(mark) > before, 5, f"{name} published")
        return proc, epoch, f"http://127.0.0.1:{http_port}/hls/{name}.m3u8"

    try:
        yield start
    finally:
        for proc in started:
            stop([proc])


def _agent(name: str, tmp_path: Path, url: str, duration: float, epoch: float | None,
           live_file: Path | None = None) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """Start a viewer as the lab does (its own process); (process, out file, ready file)."""
    out, ready = tmp_path / f"{name}.json", tmp_path / f"{name}.ready"
    argv = [sys.executable, "-m", f"lab.agents.{name}", "--url", url, "--stream-id", "7",
            "--duration", str(duration), "--out", str(out), "--ready-file", str(ready)]
    if epoch is not None:
        argv += ["--publish-epoch", repr(epoch)]
    if live_file is not None:
        argv += ["--live-file", str(live_file)]
    proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return proc, out, ready


def _finish(proc: subprocess.Popen[bytes], out: Path, timeout: float) -> dict[str, Any]:
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        stop([proc])
    assert proc.returncode == 0, err.decode()
    return json.loads(out.read_text())


def _chromium_gone(doc: dict[str, Any]) -> None:
    """The agent left no Chromium process: not running, and (it reaps them) not a zombie."""
    pid = doc["chromium"]["pid"]
    assert pid and doc["chromium"]["left_behind"] == []
    assert _in_session(pid) == []
    assert doc["chromium"]["processes_max"] >= 3  # browser, zygote, renderer at least


def _segments_in_order(s: dict[str, Any]) -> list[dict[str, Any]]:
    segs = [g for g in s["segments"] if g["done_s"] is not None]
    sns = [g["sn"] for g in segs]
    assert sns == list(range(sns[0], sns[0] + len(sns))), sns
    done = [g["done_s"] for g in segs]
    assert done == sorted(done)
    return segs


# --------------------------------------------------------------------------------------------
# Real streams
# --------------------------------------------------------------------------------------------


@needs_media
@needs_browser
def test_a_healthy_live_stream_plays_without_stalls_in_both_viewers(
        publish: Publish, tmp_path: Path) -> None:
    _, epoch, url = publish("healthy")
    view, view_out, _ = _agent("hlsview", tmp_path, url, 8.0, epoch)
    js, js_out, _ = _agent("hlsjsview", tmp_path, url, 10.0, epoch)
    doc = _finish(view, view_out, 20)
    jsdoc = _finish(js, js_out, 20)

    assert (doc["agent"], doc["media"], doc["protocol"], doc["stopped_by"]) == \
        ("hlsview", "real", "hls", None)
    [s] = doc["streams"]
    assert s["stream_id"] == 7 and s["end_reason"] == "duration" and doc["errors"] == []
    # the playlist exists after the first 1 s fragment; three of them are needed to start
    assert 1 < s["startup_delay_s"] < 6
    assert (s["stalls"], s["stall_s"], s["rebuffer_ratio"], s["starved_s"]) == (0, 0, 0, 0)
    assert s["target_duration_s"] == [1.0] and s["fps"] == 25.0
    segs = _segments_in_order(s)
    assert len(segs) >= 4 and segs[0]["sn"] == 0  # a fresh stream starts at its first
    for a, b in pairwise(segs):  # presentation time moves by EXTINF
        assert b["pts_s"] - a["pts_s"] == pytest.approx(a["duration"], abs=0.06)
        assert a["frames"] == round(a["duration"] * 25) and a["keyframes"] == 1
        assert b["request_s"] >= a["done_s"]  # one at a time, in order
    assert s["frames_missing"] == 0 and s["frames_lost"] == 0 and s["pts_restarts"] == 0
    assert s["arrivals"][0][1] == pytest.approx(0.02, abs=0.03)  # publisher's clock
    assert 2.5 < s["live_latency_s"] < 5.5

    [j] = jsdoc["streams"]
    assert j["player"].startswith("hls.js 1.7.4 in Chromium ") and j["page_ok"]
    assert j["started"] and 1 < j["startup_delay_s"] < 7
    assert (j["stalls"], j["stall_s"]) == (0, 0) and j["end_reason"] == "duration"
    # H.264 decodes. A renderer starved by other load may drop a decoded frame at its
    # deadline (seen once in a full test run): that is the machine, not the stream.
    assert j["frames_decoded"] > 25 * 3 and j["frames_dropped"] <= j["frames_decoded"] // 50
    samples = [e for e in j["events"] if e["e"] == "sample" and e["t_s"] > j["startup_delay_s"]]
    played = samples[-1]["ct"] - samples[0]["ct"]
    assert played == pytest.approx(samples[-1]["t_s"] - samples[0]["t_s"], abs=0.5)
    assert 2.0 < j["live_latency_s"] < 6.0
    _chromium_gone(jsdoc)


@needs_media
@needs_browser
def test_a_publisher_killed_mid_watch_stalls_both_viewers(publish: Publish,
                                                          tmp_path: Path) -> None:
    pusher, _, url = publish("killed")
    t0 = time.time()
    view, view_out, _ = _agent("hlsview", tmp_path, url, 10.0, None)
    js, js_out, _ = _agent("hlsjsview", tmp_path, url, 11.0, None,
                           live_file=tmp_path / "hlsjs.live.json")
    time.sleep(max(0.0, t0 + 4.5 - time.time()))
    os.kill(pusher.pid, signal.SIGKILL)
    killed = time.time()
    pusher.wait()
    doc = _finish(view, view_out, 20)
    jsdoc = _finish(js, js_out, 20)

    [s] = doc["streams"]
    segs = _segments_in_order(s)
    # nginx closes the open fragment when the publisher goes; nothing is listed after that
    assert all(g["listed_unix"] < killed + 1.0 for g in segs)
    assert s["stalls"] + (s["starved_s"] > 0) >= 1
    last = s["stall_events"][-1]
    assert last["end_s"] == pytest.approx(10.0, abs=0.15) and last["duration_s"] > 0.5
    assert s["rebuffer_ratio"] > 0.1

    [j] = jsdoc["streams"]
    assert j["started"] and j["stalls"] >= 1
    waiting = [e for e in j["events"] if e["e"] == "waiting" and e["t_s"] > j["startup_delay_s"]]
    assert waiting and waiting[0]["t_s"] > killed - jsdoc["started_unix"]
    assert j["stall_events"][-1]["open"]  # nothing came back: stalled until the end
    # Its live file's last write: the summary's stalls, the last one until it left.
    final = json.loads((tmp_path / "hlsjs.live.json").read_text())
    assert final["final"] and final["state"] == "stalled"
    assert final["stall_count"] == j["stalls"] and final["first_picture"] == pytest.approx(
        final["join"] + j["startup_delay_s"], abs=1e-3)
    assert [b - a for a, b in final["stalls"]] == pytest.approx(
        [e["duration_s"] for e in j["stall_events"]], abs=2e-3)
    _chromium_gone(jsdoc)


@needs_media
def test_the_hls_live_file_follows_the_player_and_ends_as_the_summary(
        publish: Publish, tmp_path: Path) -> None:
    """With --live-file the HLS viewer says while it watches what the model says so far:
    waiting (three segments are needed to start), playing, then (the publisher killed)
    stalled; its last write is the summary's own stalls."""
    pusher, _, url = publish("livehls")
    live_file = tmp_path / "hls.live.json"
    t_start = time.monotonic()
    view, view_out, _ = _agent("hlsview", tmp_path, url, 10.0, None, live_file=live_file)
    seen = collect_live(live_file, view, 25, kill=(pusher, time.monotonic() + 5.5))
    t_end = time.monotonic()
    doc = _finish(view, view_out, 10)
    [s] = doc["streams"]
    assert s["stalls"] >= 1 and s["end_reason"] == "duration"
    check_live_against_summary(seen, s, t_start, t_end)
    assert seen[-2]["state"] == "stalled" and seen[-2]["stalls"][-1][1] is None
    assert doc["live_writes"] >= 12


@needs_media
@needs_browser
def test_a_publisher_back_after_3_s_stalls_then_both_viewers_resume(
        publish: Publish, tmp_path: Path) -> None:
    pusher, _, url = publish("restart")
    t0 = time.time()
    view, view_out, _ = _agent("hlsview", tmp_path, url, 14.0, None)
    js, js_out, _ = _agent("hlsjsview", tmp_path, url, 14.0, None)
    time.sleep(max(0.0, t0 + 4.5 - time.time()))
    os.kill(pusher.pid, signal.SIGKILL)
    pusher.wait()
    time.sleep(3.0)
    publish("restart")
    back = time.time()
    doc = _finish(view, view_out, 25)
    jsdoc = _finish(js, js_out, 25)

    [s] = doc["streams"]
    _segments_in_order(s)  # nginx goes on numbering segments across publishers
    assert s["pts_restarts"] == 1 and s["stalls"] >= 1
    assert any(g["done_unix"] and g["done_unix"] > back for g in s["segments"])
    first = s["stall_events"][0]
    assert first["end_s"] < 13.5 and s["timeline"][-1]["state"] != "stalled"

    [j] = jsdoc["streams"]
    assert j["started"] and j["stalls"] >= 1
    resumed = [e for e in j["events"]
               if e["e"] == "playing" and e["t_s"] > back - jsdoc["started_unix"]]
    assert resumed, "hls.js did not play again after the publisher came back"
    later = [e for e in j["events"] if e["e"] == "sample" and e["t_s"] > resumed[0]["t_s"]]
    assert later and later[-1]["ct"] - resumed[0]["ct"] > 1.0
    _chromium_gone(jsdoc)


@needs_browser
def test_hlsjsview_leaves_no_chromium_after_sigterm_or_sigkill(tmp_path: Path) -> None:
    """No stream is needed: Chromium runs its processes while hls.js retries the playlist."""
    url = f"http://127.0.0.1:{free_port()}/hls/none.m3u8"
    for sig in (signal.SIGTERM, signal.SIGKILL):
        run = tmp_path / sig.name
        run.mkdir()
        proc, out, ready = _agent("hlsjsview", run, url, 30.0, None)
        until(lambda r=ready: r.exists() and r.read_text().strip().isdigit(), 5, "ready")
        pid = int(ready.read_text())
        until(lambda p=pid: len(_alive_in_session(p)) >= 3, 10, "Chromium's processes")
        t = time.monotonic()
        proc.send_signal(sig)
        if sig == signal.SIGTERM:
            doc = _finish(proc, out, 5)
            assert time.monotonic() - t < 3
            assert doc["stopped_by"] == "SIGTERM" and doc["streams"][0]["started"] is False
            assert doc["chromium"]["pid"] == pid
            _chromium_gone(doc)
            assert not list(run.glob("chromium-*"))  # its profile is removed
        else:
            proc.wait(timeout=5)
            assert proc.returncode == -signal.SIGKILL
            # the browser dies with its agent, its children with it (zombies until PID 1
            # reaps them: none runs)
            until(lambda p=pid: _alive_in_session(p) == [], 5, "Chromium gone")


def test_hlsview_stops_on_sigterm_and_still_writes_its_summary(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/hls/none.m3u8"  # nothing listens there
    proc, out, ready = _agent("hlsview", tmp_path, url, 30.0, None)
    until(ready.exists, 5, "ready file")
    time.sleep(0.8)
    proc.send_signal(signal.SIGTERM)
    doc = _finish(proc, out, 5)
    [s] = doc["streams"]
    assert doc["stopped_by"] == "SIGTERM" and s["end_reason"] == "SIGTERM"
    assert s["started"] is False and s["segments"] == [] and s["playlist_reloads"] >= 2
    assert any("Connection refused" in e for e in doc["errors"])


# --------------------------------------------------------------------------------------------
# The parsers
# --------------------------------------------------------------------------------------------

PLAYLIST = """#EXTM3U
#EXT-X-VERSION:3
#EXT-X-MEDIA-SEQUENCE:7
#EXT-X-TARGETDURATION:1
#EXT-X-DISCONTINUITY
#EXTINF:1.000,
s-7.ts
#EXTINF:1.000,
s-8.ts
#EXTINF:0.720,
s-9.ts
#EXTINF:1.000,
s-10.ts
"""


def test_the_playlist_and_where_a_live_viewer_starts() -> None:
    pl = hlsview.parse_playlist(PLAYLIST, "http://h:8080/hls/s.m3u8")
    assert (pl.target_duration, pl.media_sequence, pl.ended, pl.last_sn) == (1.0, 7, False, 10)
    assert [g.sn for g in pl.segments] == [7, 8, 9, 10]
    assert pl.segments[0].discontinuity and not pl.segments[1].discontinuity
    assert pl.segments[2].url == "http://h:8080/hls/s-9.ts" and pl.segments[2].duration == 0.72
    # 3 target durations from the end: s-10 (1.0) + s-9 (0.72) + s-8 (1.0) = 2.72 < 3
    assert pl.live_start().sn == 7
    short = hlsview.parse_playlist(PLAYLIST.replace("#EXTINF:1.000,\ns-7.ts\n", ""), "http://h/")
    assert short.live_start() is None  # not 3 target durations yet: wait
    assert hlsview.parse_playlist(PLAYLIST + "#EXT-X-ENDLIST\n", "http://h/").ended
    with pytest.raises(ValueError, match="master"):
        hlsview.parse_playlist("#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1\nv.m3u8\n", "http://h/")


@needs_media
def test_the_ts_parser_finds_every_frame_and_its_pts(clip: Path, tmp_path: Path) -> None:
    ts = tmp_path / "two.ts"
    subprocess.run([str(FFMPEG), "-nostdin", "-loglevel", "error", "-i", str(clip), "-t", "2",
                    "-c", "copy", "-f", "mpegts", str(ts)], check=True, timeout=30)
    c = mpegts.parse_ts(ts.read_bytes())
    assert c.errors == [] and c.video_codec == "h264"
    assert len(c.frames) == 50 and [f.key for f in c.frames].count(True) == 2
    assert c.frames[0].key and c.frames[25].key
    steps = {round(b.pts - a.pts, 3) for a, b in pairwise(c.frames)}
    assert steps == {0.04}
    assert sum(f.size for f in c.frames) > 2e6 / 8  # about 2 s at 2 Mbit/s of video
    assert c.audio_packets > 0


def test_the_hlsjs_events_give_startup_stalls_and_latency() -> None:
    join = 1000.0

    def ev(t: float, e: str, ct: float = 0.0, **kw: Any) -> dict[str, Any]:
        return {"t": (join + t) * 1e3, "e": e, "ct": ct, "buf": 0.0, **kw}

    events = [ev(0.3, "page", ok=True, version="1.7.4",
                 ua="Mozilla/5.0 HeadlessChrome/156.0.8078.114 Safari/537.36"),
              ev(0.4, "waiting"),  # start-up: not a stall
              ev(0.5, "initpts", initpts=63000, timescale=90000),
              ev(1.0, "playing", 0.0),
              ev(2.0, "sample", 1.0, lat=3.2), ev(3.0, "sample", 2.0, lat=3.3),
              ev(3.5, "waiting", 2.5), ev(4.0, "sample", 2.5, lat=3.5),
              ev(5.0, "playing", 2.5), ev(6.0, "sample", 3.5, lat=4.3),
              ev(7.0, "waiting", 4.5),
              ev(7.1, "hlserror", 4.5, type="mediaError", details="bufferStalledError",
                 fatal=False)]
    # the publisher sent PTS 0 at 997.0: the frame at ct 1.0 (PTS 1.0) was sent at 998.0
    s = hlsjsview.summarize(events, join_unix=join, stop_s=8.0, stream_id=3,
                            publish_epoch=997.0)
    assert s["player"] == "hls.js 1.7.4 in Chromium 156.0.8078.114"
    assert s["startup_delay_s"] == pytest.approx(1.0)
    assert s["stalls"] == 2 and s["waiting_events"] == 3 and s["buffer_stalled_errors"] == 1
    first, last = s["stall_events"]
    assert (first["start_s"], first["end_s"], first["open"]) == \
        pytest.approx((3.5, 5.0, False))
    assert (last["start_s"], last["end_s"], last["open"]) == pytest.approx((7.0, 8.0, True))
    assert s["stall_s"] == pytest.approx(2.5) and s["play_s"] == pytest.approx(4.5)
    assert s["rebuffer_ratio"] == pytest.approx(2.5 / 7.0)
    # samples while playing: 1002 - (997 + 1.0) = 4.0, 4.0, 5.5 (the one in the stall left out)
    assert s["live_latency_s"] == pytest.approx(4.0)
    assert s["hlsjs_latency_s"] == pytest.approx(3.4)  # 3.2, 3.3, 3.5, 4.3
    line = ('[1205/111800.911086:INFO:CONSOLE:47] "EVT {"t":1.5,"e":"playing","ct":0,'
            '"buf":1}", source: http://127.0.0.1:8080/player/index.html (47)')
    assert hlsjsview.parse_evt(line) == {"t": 1.5, "e": "playing", "ct": 0, "buf": 1}
    assert hlsjsview.parse_evt("[...:INFO:CONSOLE:1] \"other\"") is None


def test_the_page_url_points_the_page_at_the_playlist() -> None:
    url = hlsjsview.page_url("http://10.0.0.5:8080/hls/big1.m3u8")
    assert url == "http://10.0.0.5:8080/player/index.html#src=%2Fhls%2Fbig1.m3u8&sample_ms=500"
