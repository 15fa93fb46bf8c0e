"""The real RTMP viewer (``lab.agents.rtmpview``) on real media: no mocks.

A 4 s H.264+AAC FLV clip (25 fps, a keyframe every second) is pushed in a loop by ffmpeg
(``-re``: at its own pace, as an encoder would) into an nginx with the RTMP module on
127.0.0.1, and the viewer watches it as a separate process, the way the lab starts it. On
loopback nothing is lost or late, so the player model must see 25 frames a second, no
missing frame and no stall, and a start-up of the time to the first keyframe plus one
second of buffer. Killing the publisher mid-watch must show as frames stopping and the
player stalling; SIGTERM must still give the JSON and leave no ffprobe behind.

The model's bookkeeping (PTS slots, the trailing stall, starvation) is also checked on
hand-made arrivals, which needs none of the programs.
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
from pathlib import Path
from typing import Any

import pytest

from lab.agents import rtmpview
from lab.agents.viewing import Recording, Watch, presentation_indices, summarize
from lab.kinds.streaming.media import stop
from tests.unit.media_support import check_live_against_summary, collect_live, nginx, until

REPO = Path(__file__).resolve().parents[2]
FFMPEG = Path("/usr/bin/ffmpeg")
FFPROBE = Path("/usr/bin/ffprobe")
RTMP_MODULE = Path("/usr/lib/nginx/modules/ngx_rtmp_module.so")
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
FPS = 25.0

_MISSING = [str(p) for p in (FFMPEG, FFPROBE, RTMP_MODULE, Path(NGINX)) if not p.exists()]
needs_rtmp = pytest.mark.skipif(
    bool(_MISSING), reason="needs ffmpeg, ffprobe and nginx with the RTMP module "
    f"(apt-get install ffmpeg libnginx-mod-rtmp); missing: {', '.join(_MISSING)}")


def _gone(pid: int) -> bool:
    """The process no longer exists, not even as a zombie: its parent reaped it."""
    return not Path(f"/proc/{pid}").exists()


# --------------------------------------------------------------------------------------------
# The bench: a clip, an RTMP server, publishers
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("media") / "clip.flv"
    subprocess.run([str(FFMPEG), "-nostdin", "-y", "-loglevel", "error",
                    "-f", "lavfi", "-i", "testsrc2=size=320x180:rate=25",
                    "-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000", "-t", "4",
                    "-c:v", "libx264", "-preset", "veryfast", "-bf", "0", "-g", "25",
                    "-keyint_min", "25", "-sc_threshold", "0", "-b:v", "500k",
                    "-c:a", "aac", "-b:a", "64k", "-f", "flv", str(path)],
                   check=True, timeout=60)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """The lab's ingest nginx-rtmp on a free loopback port: (port, its directory)."""
    root = tmp_path_factory.mktemp("nginx")
    with nginx(root, "ingest") as srv:
        yield srv.rtmp_port, root


Publish = Callable[[str], tuple[subprocess.Popen[bytes], float, str]]


@pytest.fixture
def publish(clip: Path, server: tuple[int, Path]) -> Iterator[Publish]:
    """Start pushing the clip in a loop as stream ``name``: (process, the wall-clock time
    just before it started, i.e. about when PTS 0 left, the stream's URL)."""
    port, root = server
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> tuple[subprocess.Popen[bytes], float, str]:
        url = f"rtmp://127.0.0.1:{port}/live/{name}"
        epoch = time.time()
        proc = subprocess.Popen([str(FFMPEG), "-nostdin", "-loglevel", "warning", "-re",
                                 "-stream_loop", "-1", "-i", str(clip), "-c", "copy",
                                 "-f", "flv", url],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        started.append(proc)
        log = root / "error.log"
        until(lambda: f"publish: name='{name}'" in log.read_text(), 5, f"{name} published")
        return proc, epoch, url

    try:
        yield start
    finally:
        for proc in started:
            stop([proc])


def _view(tmp_path: Path, url: str, duration: float, epoch: float | None = None,
          live_file: Path | None = None) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """Start the viewer as the lab does (its own process); (process, out file, ready file)."""
    out, ready = tmp_path / "view.json", tmp_path / "view.ready"
    argv = [sys.executable, "-m", "lab.agents.rtmpview", "--url", url, "--stream-id", "7",
            "--fps", str(FPS), "--duration", str(duration), "--out", str(out),
            "--ready-file", str(ready), "--ffprobe", str(FFPROBE)]
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


# --------------------------------------------------------------------------------------------
# Real streams
# --------------------------------------------------------------------------------------------


@needs_rtmp
def test_a_healthy_stream_plays_at_its_frame_rate_without_stalls(
        publish: Publish, tmp_path: Path) -> None:
    _, epoch, url = publish("healthy")
    viewer, out, _ = _view(tmp_path, url, 4.0, epoch)
    doc = _finish(viewer, out, 15)
    assert (doc["tool"], doc["media"], doc["protocol"], doc["stopped_by"]) == \
        ("play", "real", "rtmp", None)
    [s] = doc["streams"]
    assert s["stream_id"] == 7 and s["end_reason"] == "duration"
    first = s["first_arrival_unix"] - s["join_unix"]
    assert 0 < first < 1.8  # connect, then nginx waits for the next keyframe (1 s GOP)
    # 25 frames a second from the first one to the end of the watch (one either way)
    assert abs(s["frames_received"] - FPS * (4.0 - first)) <= 2.5
    ts = [row[0] for row in s["arrivals"]]
    assert ts == sorted(ts) and s["arrivals"][0][2] == 1  # it starts at a keyframe
    rate = (len(ts) - 1) / (ts[-1] - ts[0])
    assert abs(rate - FPS) < 1.5
    assert s["frames_missing"] == 0 and s["frames_lost"] == 0 and s["duplicates"] == 0
    assert (s["stalls"], s["stall_count"], s["stall_s"], s["rebuffer_ratio"]) == (0, 0, 0, 0)
    assert s["starved_s"] == 0
    # the first keyframe, then one second of media (25 frames, the 25th 24 periods on)
    assert 0 < s["startup_delay_s"] < 3
    assert s["startup_delay_s"] == pytest.approx(first + 24 / FPS, abs=0.15)
    assert s["bytes"] == s["video_bytes"] + s["audio_bytes"] and s["audio_packets"] > 100
    assert s["buffer_rule"] == {"startup_ms": 1000.0, "rebuffer_ms": 2000.0,
                                "source": "ExoPlayer media3 DefaultLoadControl"}
    # on loopback a frame arrives as it is sent; the picture is one buffer (1 s) behind
    assert 0 <= s["delay_ms"]["p50"] < 500
    assert 0.9 < s["live_latency_s"] < 1.6
    assert _gone(doc["ffprobe"]["pid"]) and doc["ffprobe"]["cpu_s"] is not None


@needs_rtmp
def test_sigterm_mid_watch_writes_the_summary_and_leaves_no_ffprobe(
        publish: Publish, tmp_path: Path) -> None:
    _, _, url = publish("sigterm")
    viewer, out, ready = _view(tmp_path, url, 30.0)
    until(lambda: ready.exists() and ready.read_text().strip().isdigit(), 5, "ready file")
    ffprobe_pid = int(ready.read_text())
    assert not _gone(ffprobe_pid)
    time.sleep(2.0)
    t = time.monotonic()
    viewer.send_signal(signal.SIGTERM)
    doc = _finish(viewer, out, 5)
    assert time.monotonic() - t < 3
    assert doc["stopped_by"] == "SIGTERM" and doc["ffprobe"]["pid"] == ffprobe_pid
    assert doc["ffprobe"]["returncode"] == -signal.SIGTERM
    [s] = doc["streams"]
    assert s["end_reason"] == "SIGTERM" and s["frames_received"] > 5
    assert s["watch_s"] < 3
    assert _gone(ffprobe_pid)


@needs_rtmp
def test_a_publisher_that_dies_leaves_the_viewer_stalled(publish: Publish,
                                                         tmp_path: Path) -> None:
    """nginx tells the viewer the stream was unpublished but keeps the connection, so the
    frames just stop: the buffer drains, then the player waits until the viewer leaves."""
    pusher, _, url = publish("dies")
    viewer, out, ready = _view(tmp_path, url, 5.5)
    t0 = time.time()
    until(ready.exists, 5, "ready file")
    time.sleep(max(0.0, t0 + 2.8 - time.time()))
    os.kill(pusher.pid, signal.SIGKILL)
    killed = time.time()
    pusher.wait()
    doc = _finish(viewer, out, 10)
    [s] = doc["streams"]
    last = s["join_unix"] + s["arrivals"][-1][0]
    assert last < killed + 0.3, "frames kept coming after the publisher died"
    assert s["stalls"] == 1 and s["end_reason"] == "duration"
    stall = s["stall_events"][-1]
    # the stall starts when the buffer ran dry, after the last frame, and lasts to the end
    assert stall["start_s"] > last - s["join_unix"]
    assert stall["start_s"] + stall["duration_s"] == pytest.approx(5.5, abs=0.1)
    assert s["rebuffer_ratio"] > 0.2 and s["stall_longest_s"] == stall["duration_s"]
    assert s["timeline"][-2]["state"] == "stalled"
    assert _gone(doc["ffprobe"]["pid"])


@needs_rtmp
def test_the_live_file_follows_the_player_and_ends_as_the_summary(publish: Publish,
                                                                   tmp_path: Path) -> None:
    """With --live-file the viewer says while it watches what its model says so far: waiting,
    then playing, then (the publisher killed) stalled, on the lab's monotonic clock; its
    last write is the summary's own stalls."""
    pusher, _, url = publish("live")
    live_file = tmp_path / "view.live.json"
    t_start = time.monotonic()
    viewer, out, ready = _view(tmp_path, url, 6.0, live_file=live_file)
    until(ready.exists, 5, "ready file")
    seen = collect_live(live_file, viewer, 20, kill=(pusher, t_start + 3.5))
    t_end = time.monotonic()
    doc = _finish(viewer, out, 10)
    [s] = doc["streams"]
    assert s["stalls"] == 1 and s["end_reason"] == "duration"
    check_live_against_summary(seen, s, t_start, t_end)
    stalled = [d for d in seen if d["state"] == "stalled" and not d["final"]]
    # While still watching, the stall is open; it began after the publisher was killed.
    assert stalled and stalled[0]["stalls"][-1][1] is None
    assert stalled[0]["stalls"][-1][0] > t_start + 3.5
    assert doc["live_writes"] >= 8 and not (tmp_path / "view.live.json.tmp").exists()


# --------------------------------------------------------------------------------------------
# The model's bookkeeping on hand-made arrivals
# --------------------------------------------------------------------------------------------


def _recording(rows: list[tuple[float, float, bool]]) -> Recording:
    """Video frames arriving at ``t`` (s since the join) with ``pts``; keyframe flag."""
    rec = Recording(0.0)
    for t, pts, key in rows:
        rec.add_line(f"video,1,{pts:.3f},{pts:.3f},1000,{'K_' if key else '__'}",
                     t, int((1000 + t) * 1e9))
    return rec


def _paced(n: int, start: float = 0.5, pts0: float = 10.0) -> list[tuple[float, float, bool]]:
    return [(start + k / FPS, pts0 + k / FPS, k % 25 == 0) for k in range(n)]


def _summary(rec: Recording, stop: float, reason: str = "duration",
             epoch: float | None = None) -> dict[str, Any]:
    return summarize(rec, stream_id=1, fps=FPS, startup_ms=1000, rebuffer_ms=2000,
                     watch=Watch(1000.0, stop, 4.0, reason), publish_epoch=epoch)


def test_pts_slots_count_gaps_and_survive_a_restarted_timeline() -> None:
    # a frame dropped (10.08), two arriving out of PTS order, then the publisher restarts
    slots, restarts = presentation_indices([10.0, 10.04, 10.16, 10.12, 0.0, 0.04], FPS)
    assert slots == [0, 1, 4, 3, 5, 6] and restarts == 1
    # a looped clip: every 100 frames the PTS step is 51 ms, not 40; no frame is missing
    pts = [loop * 4.011 + k / FPS for loop in range(8) for k in range(100)]
    slots, _ = presentation_indices(pts, FPS)
    assert slots == list(range(800))
    assert presentation_indices([1.0, 1.0, 1.04], FPS) == ([0, 0, 1], 0)  # a duplicate


def test_a_steady_stream_starts_after_one_second_of_media_and_never_stalls() -> None:
    s = _summary(_recording(_paced(88)), stop=4.0, epoch=1000.5 - 10.0)
    assert s["frames_received"] == 88 and s["frames_missing"] == 0
    assert s["startup_delay_s"] == pytest.approx(0.5 + 24 / FPS)
    assert (s["stalls"], s["starved_s"], s["rebuffer_ratio"]) == (0, 0.0, 0.0)
    assert s["delay_ms"]["p50"] == pytest.approx(0, abs=1e-3)  # sent as it arrived
    assert s["live_latency_s"] == pytest.approx(24 / FPS)      # shown one buffer later


def test_frames_before_the_first_keyframe_are_not_played_and_gaps_are_missing() -> None:
    rows = [(0.3, 9.92, False), (0.34, 9.96, False), *_paced(60)]
    del rows[30]  # one frame the server never sent
    s = _summary(_recording(rows), stop=3.5)  # before the last frame's turn: no trailing stall
    assert s["frames_before_keyframe"] == 2 and s["frames_missing"] == 1
    assert s["frames_lost"] == 1 and s["frames_skipped"] == 1 and s["stalls"] == 0


def test_frames_that_stop_while_the_viewer_watches_end_in_a_stall() -> None:
    s = _summary(_recording(_paced(40)), stop=4.0)
    # playing from 1.46 s, the 40 frames last until 3.06 s; then nothing until 4.0 s
    assert s["stalls"] == 1 and s["starved_s"] == 0
    [e] = s["stall_events"]
    assert e["start_s"] == pytest.approx(0.5 + 24 / FPS + 40 / FPS)
    assert e["start_s"] + e["duration_s"] == pytest.approx(4.0)
    assert s["rebuffer_ratio"] == pytest.approx(e["duration_s"] / (4.0 - 0.5 - 24 / FPS))


def test_a_stream_that_ended_starves_the_viewer_instead() -> None:
    s = _summary(_recording(_paced(40)), stop=2.2, reason="eof")
    assert s["stalls"] == 0 and s["starved_s"] == pytest.approx(4.0 - (0.5 + 64 / FPS))


def test_a_viewer_that_left_before_the_picture_never_started() -> None:
    s = _summary(_recording(_paced(10)), stop=1.0, reason="SIGTERM")
    assert s["started"] is False and s["startup_delay_s"] is None and s["stalls"] == 0


def test_the_ffprobe_command_is_the_one_documented() -> None:
    argv = rtmpview.ffprobe_argv("rtmp://h/live/s", "/usr/bin/ffprobe")
    assert argv[-1] == "rtmp://h/live/s" and "/usr/bin/ffprobe" in argv
    assert "nobuffer" not in argv and argv[argv.index("-fpsprobesize") + 1] == "0"
