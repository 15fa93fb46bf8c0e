"""A real RTMP viewer, run inside a host's namespace: ffprobe reads the stream, we time the frames.

``python -m lab.agents.rtmpview --url rtmp://… --fps 25 --duration 30 --out view.json``
connects to an RTMP server (nginx-rtmp in the lab) the way a player does, notes when each
video frame arrived, and after it stops runs the lab's player model
(:func:`lab.agents.playout.simulate_playout`) over those arrivals. Its summary has the shape
of ``lab.agents.streamer play``'s (``{"streams": [...]}``, the same per-stream keys), so the
lab reads a real viewer and a synthetic one alike; ``"media": "real"`` tells them apart.

Why ffprobe, and why these flags (checked against Debian's ffprobe 5.1 and nginx-rtmp 1.2):

* ``-show_packets`` prints one CSV line per packet without decoding, so the process is
  cheap and the line appears the moment the demuxer has the packet. ffprobe 5.1 writes every
  line with its own ``write()`` (``stdbuf -oL`` is kept only as a guard for builds that
  buffer stdio; it execs ffprobe, so the PID we hold is ffprobe's own).
* ffprobe prints packets only of the streams that exist when its stream analysis ends. The
  FLV demuxer creates a stream at its first packet, and nginx-rtmp (``wait_key on``, its
  default) holds a new viewer's video back until the next keyframe while audio flows at
  once. So ``-probesize 32`` ends the analysis on the first audio packet and no video is
  ever printed; the analysis must instead last until the first video packet: a large
  ``-probesize`` and ``-analyzeduration`` as limits, and ``-fpsprobesize 0`` so that it
  ends as soon as both streams are there and decoded, instead of counting 40 frames to
  guess the frame rate.
* no ``-fflags nobuffer``: it throws away the packets read during that analysis, here the
  first keyframe, so nothing would be decodable for another GOP. Without it they are
  printed in one burst when the analysis ends; the keyframe is the last of them, so its
  stamp is its arrival (plus its decode, milliseconds), and what came before it is audio.
* ``-f flv``: RTMP always carries FLV, so the demuxer is named instead of guessed from the
  first 2 KiB (with only audio flowing until the first keyframe, that is 250 ms at 64 kbit/s).
* ``-tcp_nodelay 1``, as librtmp (ExoPlayer's RTMP extension) sets it: ffmpeg's RTMP leaves
  Nagle on by default, and each small message of the handshake then waits on a delayed ACK
  (40 ms steps: ``play`` is sent ~200 ms after start instead of ~100 ms on loopback).
* ``-rw_timeout`` bounds connecting and waiting for a stream to start (ffprobe then exits
  with an error); once playing, a stream that goes silent (the publisher gone: nginx says
  so and keeps the connection) does not end ffprobe, so ``--duration`` is what ends a watch.

The player model's buffer rule defaults to ExoPlayer's (media3 ``DefaultLoadControl``:
``DEFAULT_BUFFER_FOR_PLAYBACK_MS`` = 1000 to start,
``DEFAULT_BUFFER_FOR_PLAYBACK_AFTER_REBUFFER_MS`` = 2000 to resume after a stall). Playback
starts at the first keyframe that arrived (a decoder cannot show the frames before it);
frame ``k`` is the one whose PTS is ``k`` frame periods after that keyframe's, so a PTS gap
is a frame the server never sent. Beside the synthetic player's keys a summary has
``frames_missing``, ``stall_count``/``stall_total_s``/``stall_longest_s``,
``rebuffer_ratio`` (CTA-2066: stall time over stall plus play time), ``live_latency_s`` and
``arrivals`` (``[t_s, pts_s, key, bytes]`` per video frame, to run another model on).

Times in the summary are seconds since this viewer started (``join_unix``): the viewer is the
one who starts waiting, so ``startup_delay_s`` is how long it waited for a picture. Arrivals
are stamped with ``time.monotonic()`` (for the model) and ``time.time_ns()`` (the wall clock
every namespace shares, for latency against ``--publish-epoch``).

With ``--live-file PATH`` (the lab gives it while a live view is on) the viewer also says
how its player is doing while it watches: about every 0.5 s it runs the same model over the
frames so far, as if the watch ended then, and rewrites ``PATH`` atomically with
``state`` (``waiting`` for the first picture, ``playing``, ``stalled``, ``ended``),
``first_picture``, ``stalls`` (``[start, end]``, end ``null`` while still stalled) and
``stall_count``, times in ``time.monotonic()`` seconds (CLOCK_MONOTONIC is one clock in
every network namespace of a kernel, so the lab needs no conversion). After it stops it
writes the file once more from the summary's own model (``"final": true``), so the last
live state and the summary agree. A stall that the model later sees end differently (a
rebuffer that had not yet refilled) is shown as still open until it does; without
``--live-file`` none of this is computed.

On SIGTERM/SIGINT the viewer stops and still writes what it has; its ffprobe child is
stopped by PID on every way out (and dies with it, by ``PR_SET_PDEATHSIG``, if the viewer
is killed outright).

This runs inside hosts: standard library and ``lab.agents`` only.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from statistics import median
from typing import Any

from lab.agents import playout
from lab.agents.common import (
    STOP_SIGNALS,
    LiveFile,
    StopRequestedError,
    add_viewer_arguments,
    catch_signals,
    cpu_seconds,
    ignore_signals,
    live_state,
    percentile,
    positive_float,
    write_json,
)
from lab.agents.workerbase import cpu_s

#: ExoPlayer media3 DefaultLoadControl: DEFAULT_BUFFER_FOR_PLAYBACK_MS (media buffered before
#: playback starts) and DEFAULT_BUFFER_FOR_PLAYBACK_AFTER_REBUFFER_MS (before it resumes).
DEFAULT_STARTUP_MS = 1000.0
DEFAULT_REBUFFER_MS = 2000.0
BUFFER_RULE_SOURCE = "ExoPlayer media3 DefaultLoadControl"
#: Limits of ffprobe's stream analysis: it normally ends long before, at the first video
#: packet (at most a GOP after joining); these only bound a stream that has no video.
PROBESIZE_BYTES = 10_000_000
ANALYZE_US = 10_000_000
#: Connecting, and waiting for the stream to start, may take this long (microseconds).
RW_TIMEOUT_US = 5_000_000
#: A PTS going back more than this (or forward more than ``PTS_JUMP_FORWARD_S``) is a new
#: timeline (a publisher that reconnected), not reordering or dropped frames.
PTS_JUMP_BACK_S, PTS_JUMP_FORWARD_S = 1.0, 60.0
#: The arrival list's columns, one row per video frame.
ARRIVAL_FIELDS = ("t_s", "pts_s", "key", "bytes")
#: The player model's timeline step (its default), seconds.
TIMELINE_STEP_S = 1.0
#: How much of ffprobe's stderr is kept for the summary.
STDERR_KEEP = 4000
#: prctl(2) option: a signal the child gets when its parent dies.
_PR_SET_PDEATHSIG = 1


def ffprobe_argv(url: str, ffprobe: str = "ffprobe") -> list[str]:
    """The ffprobe command that prints one CSV line per packet of ``url`` (module docstring:
    why each flag). Fields: codec_type, stream_index, pts_time, dts_time, size, flags."""
    argv = [ffprobe, "-v", "error", "-f", "flv",
            "-probesize", str(PROBESIZE_BYTES), "-analyzeduration", str(ANALYZE_US),
            "-fpsprobesize", "0", "-rw_timeout", str(RW_TIMEOUT_US), "-tcp_nodelay", "1",
            "-show_packets", "-show_entries",
            "packet=codec_type,stream_index,pts_time,dts_time,size,flags",
            "-of", "csv=p=0", url]
    stdbuf = shutil.which("stdbuf")
    return [stdbuf, "-oL", *argv] if stdbuf else argv


# --------------------------------------------------------------------------------------------
# What arrived
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VideoFrame:
    """One video packet: when it arrived (seconds since the viewer started, and wall-clock
    ns) and what it was (PTS and DTS in seconds, keyframe, payload bytes)."""

    t: float
    wall_ns: int
    pts: float
    dts: float
    key: bool
    size: int


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "N/A": the demuxer had no timestamp


@dataclass
class Recording:
    """Everything ffprobe printed, cut into lines and stamped as it was read."""

    t0: float
    frames: list[VideoFrame] = field(default_factory=list)
    audio_packets: int = 0
    audio_bytes: int = 0
    first_t: float | None = None
    last_t: float | None = None
    unparsed: int = 0
    _rest: bytes = b""

    def feed(self, data: bytes, mono: float, wall_ns: int) -> None:
        """A chunk read at ``mono`` / ``wall_ns``: its complete lines arrived then."""
        *lines, self._rest = (self._rest + data).split(b"\n")
        for line in lines:
            if line.strip():
                self.add_line(line.decode(errors="replace"), mono - self.t0, wall_ns)

    def add_line(self, line: str, t: float, wall_ns: int) -> None:
        """One packet line (``codec_type,stream_index,pts_time,dts_time,size,flags``)."""
        parts = line.strip().split(",")
        if len(parts) < 6 or not parts[4].isdigit():
            self.unparsed += 1
            return
        kind, size = parts[0], int(parts[4])
        if kind == "audio":
            self.audio_packets += 1
            self.audio_bytes += size
        elif kind == "video":
            pts, dts = _float(parts[2]), _float(parts[3])
            if pts is None:
                pts = dts
            if pts is None:
                self.unparsed += 1
                return
            self.frames.append(VideoFrame(t, wall_ns, pts, pts if dts is None else dts,
                                          parts[5].startswith("K"), size))
        else:
            return
        self.first_t = t if self.first_t is None else self.first_t
        self.last_t = t


# --------------------------------------------------------------------------------------------
# From arrivals to what the viewer saw
# --------------------------------------------------------------------------------------------


def presentation_indices(pts: Sequence[float], fps: float) -> tuple[list[int], int]:
    """Each frame's slot on the playout clock (in arrival order; slot 0 is the earliest PTS),
    and how many times the PTS timeline restarted.

    Slots advance by each step between neighbouring PTS rounded to whole frame periods (at
    least one: a different PTS is a different frame; the same PTS is a duplicate), not by
    ``round(pts · fps)``: a timeline that drifts against the nominal rate (ffmpeg's
    ``-stream_loop`` steps 51 ms, not 40, from one loop of a 25 fps clip to the next) then
    never rounds into a missing frame, while a dropped frame (a step of two periods) still
    leaves its slot empty. B-frames arrive out of PTS order, so slots are counted over the
    frames sorted by PTS. A restart (a jump back of more than ``PTS_JUMP_BACK_S`` or forward
    of more than ``PTS_JUMP_FORWARD_S`` between arrivals, a publisher that reconnected)
    continues after the highest slot so far."""
    runs: list[list[int]] = []
    for i, p in enumerate(pts):
        prev = pts[i - 1] if i else None
        if prev is None or p < prev - PTS_JUMP_BACK_S or p > prev + PTS_JUMP_FORWARD_S:
            runs.append([])
        runs[-1].append(i)
    out = [0] * len(pts)
    base = 0
    for run in runs:
        slot, last = base, None
        for i in sorted(run, key=lambda j: pts[j]):
            if last is not None and pts[i] != last:
                slot += max(1, round((pts[i] - last) * fps))
            out[i], last = slot, pts[i]
        base = slot + 1
    return out, max(0, len(runs) - 1)


def _display_times(stats: playout.PlayoutStats, n: int) -> list[float]:
    """When the modelled player showed slot k (or would have): its playout clock is the
    start plus whole frame periods, pushed back by every stall at or before k."""
    if stats.startup_delay_s is None:
        return []
    stalls = sorted((e.seq, e.duration_s) for e in stats.stall_events)
    out, extra, j = [], 0.0, 0
    for k in range(n):
        while j < len(stalls) and stalls[j][0] <= k:
            extra += stalls[j][1]
            j += 1
        out.append(stats.startup_delay_s + k / stats.fps + extra)
    return out


@dataclass(frozen=True)
class Watch:
    """How a watch went, as the summary needs it: the viewer's start (wall clock), when it
    stopped watching and why, and what it had planned."""

    join_unix: float
    stop_s: float
    duration_s: float
    end_reason: str


def _watch_end(watch: Watch) -> float:
    """Until when the viewer wanted a picture: the planned end, unless it left earlier."""
    left = watch.end_reason not in ("eof", "error")
    return min(watch.stop_s, watch.duration_s) if left else watch.duration_s


def _latency(frames: Sequence[VideoFrame], idx: Sequence[int], key_slot: int,
             stats: playout.PlayoutStats, watch: Watch, epoch: float | None,
             ) -> tuple[dict[str, float | None], float | None]:
    """Delivery delay per frame (arrival minus the publisher's send time ``epoch + dts``, in
    ms, like the synthetic player's ``delay_ms``) and the live latency: the median, over the
    frames shown before the viewer left, of display time minus ``epoch + pts``."""
    none: dict[str, float | None] = {"p50": None, "p99": None, "mean": None, "max": None}
    if epoch is None or not frames:
        return none, None
    delays = [f.wall_ns / 1e6 - (epoch + f.dts) * 1e3 for f in frames]
    delay = {"p50": percentile(delays, 50), "p99": percentile(delays, 99),
             "mean": sum(delays) / len(delays), "max": max(delays)}
    shown = _display_times(stats, stats.frames_expected)
    end = _watch_end(watch)
    live = [watch.join_unix + shown[k - key_slot] - (epoch + f.pts)
            for f, k in zip(frames, idx, strict=True)
            if 0 <= k - key_slot < len(shown) and f.t <= shown[k - key_slot] + 1e-9
            and shown[k - key_slot] <= end]
    return delay, (median(live) if live else None)


def _viewer_keys(stats: playout.PlayoutStats, watch: Watch) -> dict[str, Any]:
    """Stalls the way QoE studies report them. ``rebuffer_ratio`` is CTA-2066's: stall time
    over stall plus play time, start-up excluded (Puffer divides stall time by the whole
    watch time instead). Play time and ``starved_s`` (no picture because the stream ended
    or never came) count only up to when the viewer stopped wanting to watch."""
    end = _watch_end(watch)
    stall_s = stats.stall_s
    if stats.startup_delay_s is None or stats.play_end_s is None:
        play_s, starved = 0.0, end
    else:
        play_s = max(0.0, min(stats.play_end_s, end) - stats.startup_delay_s - stall_s)
        starved = max(0.0, end - stats.play_end_s)
    total = stall_s + play_s
    return {
        "stall_count": stats.stalls, "stall_total_s": stall_s,
        "stall_longest_s": max((e.duration_s for e in stats.stall_events), default=0.0),
        "play_s": play_s, "starved_s": starved, "watch_s": end,
        "rebuffer_ratio": stall_s / total if total > 0 else None,
    }


def _model(frames: Sequence[VideoFrame], idx: Sequence[int], fps: float, startup_ms: float,
           rebuffer_ms: float, stop_s: float, timeline_step_s: float = TIMELINE_STEP_S,
           ) -> tuple[playout.PlayoutStats, int, int]:
    """Run the player model from the first keyframe that arrived; return its stats, that
    keyframe's slot and how many frames came before it (undecodable, never shown)."""
    key_at = next((i for i, f in enumerate(frames) if f.key), None)
    if key_at is None:
        return playout.simulate_playout([], fps, startup_ms, rebuffer_ms), 0, len(frames)
    key_slot = idx[key_at]
    arrivals = [(k - key_slot, f.t) for f, k in zip(frames[key_at:], idx[key_at:], strict=True)]
    stats = playout.simulate_playout(arrivals, fps, startup_ms, rebuffer_ms, join_time=0.0,
                                     eos_time=stop_s, timeline_step_s=timeline_step_s)
    return stats, key_slot, key_at


def _trailing_stall(stats: playout.PlayoutStats, watch: Watch) -> None:
    """A live stream whose frames stopped while the viewer still watched is a stall.

    The model knows only the frames that came, so it ends playback after the last one. But
    unless the stream ended (ffprobe's end of file), the player was waiting for the next
    frame with an empty buffer until the viewer left: add that stall, and say so in the
    timeline."""
    if (watch.end_reason in ("eof", "error") or not stats.started
            or stats.play_end_s is None or stats.play_end_s >= watch.stop_s):
        return
    start, length = stats.play_end_s, watch.stop_s - stats.play_end_s
    stats.stall_events.append(playout.StallEvent(start, length, stats.frames_expected))
    stats.stalls += 1
    stats.stall_s += length
    stats.play_end_s = watch.stop_s
    for point in stats.timeline:
        if start <= point.t < watch.stop_s:
            point.state, point.stalled = "stalled", True
    t = stats.timeline[-1].t if stats.timeline else start
    while t < watch.stop_s:  # the model's timeline ends at its own end of playback
        t = round(t + TIMELINE_STEP_S, 6)
        waiting = t < watch.stop_s
        stats.timeline.append(playout.TimelinePoint(t, 0.0, "stalled" if waiting else "ended",
                                                    waiting))


def play(rec: Recording, fps: float, startup_ms: float, rebuffer_ms: float, watch: Watch,
         timeline_step_s: float = TIMELINE_STEP_S,
         ) -> tuple[playout.PlayoutStats, list[int], int, int, int]:
    """The player model over what arrived until ``watch.stop_s``: its stats, each frame's
    slot, the PTS restarts, the first keyframe's slot and the frames before it. The summary
    and the live file (:func:`live`) both come from here, so what a live view showed and
    what the summary says are one model's answers, at two times."""
    frames = rec.frames
    idx, restarts = presentation_indices([f.pts for f in frames], fps)
    stats, key_slot, before_key = _model(frames, idx, fps, startup_ms, rebuffer_ms,
                                         watch.stop_s, timeline_step_s)
    if (stats.startup_delay_s is not None and watch.end_reason not in ("eof", "error")
            and stats.startup_delay_s >= watch.stop_s):
        stats.started, stats.startup_delay_s = False, None  # left before the picture came
    _trailing_stall(stats, watch)
    return stats, idx, restarts, key_slot, before_key


def live(rec: Recording, *, agent: str, stream_id: int, fps: float, startup_ms: float,
         rebuffer_ms: float, watch: Watch, t0: float, now: float,
         final: bool = False) -> dict[str, Any]:
    """The live file's state (:func:`lab.agents.common.live_state`) at ``now``: the model of
    :func:`play` with the watch ending now, so that a stream whose frames stopped is a stall
    still open. No timeline is sampled: only the stalls are wanted, twice a second."""
    stats, *_ = play(rec, fps, startup_ms, rebuffer_ms, watch, timeline_step_s=0.0)
    stop = watch.stop_s
    # A stall the model ends at the watch's end is one still going on (unless it was final).
    stalls = [(e.start_s, e.start_s + e.duration_s
               if final or e.start_s + e.duration_s < stop - 1e-6 else None)
              for e in stats.stall_events]
    ended = stats.play_end_s if watch.end_reason == "eof" else None
    return live_state(agent=agent, stream_id=stream_id, t0=t0, now=now,
                      startup_delay_s=stats.startup_delay_s, stalls=stalls, ended_s=ended,
                      final=final)


def summarize(rec: Recording, *, stream_id: int, fps: float, startup_ms: float,
              rebuffer_ms: float, watch: Watch, publish_epoch: float | None = None,
              ) -> dict[str, Any]:
    """The per-stream entry: the synthetic player's keys (``StreamRecord.summarize`` and
    ``PlayoutStats``), with what only a real stream has."""
    frames = rec.frames
    stats, idx, restarts, key_slot, before_key = play(rec, fps, startup_ms, rebuffer_ms,
                                                      watch)
    media = sum(f.size for f in frames) + rec.audio_bytes
    span = (rec.last_t - rec.first_t) + 1 / fps if rec.first_t is not None else 0.0
    jitter = playout.rfc3550_jitter([(f.dts, f.wall_ns / 1e9) for f in frames])
    delay, live = _latency(frames, idx, key_slot, stats, watch, publish_epoch)
    gaps = [(b.t - a.t, a.t) for a, b in pairwise(frames)]
    gap, gap_at = max(gaps, default=(0.0, frames[0].t if frames else 0.0))
    out: dict[str, Any] = {
        "stream_id": stream_id, "proto": "tcp", "media": "real", "protocol": "rtmp",
        "fps": fps, "join_unix": watch.join_unix,
        "first_arrival_unix": watch.join_unix + frames[0].t if frames else None,
        "end_reason": watch.end_reason, "frames_sent": None,
        "frames_received": len(frames),
        "frames_missing": (max(idx) - min(idx) + 1 - len(set(idx))) if idx else 0,
        "frames_before_keyframe": before_key, "keyframes": sum(f.key for f in frames),
        "pts_restarts": restarts, "duplicates": len(idx) - len(set(idx)),
        "bytes": media, "bytes_received": media, "media_bytes": media,
        "video_bytes": media - rec.audio_bytes, "audio_bytes": rec.audio_bytes,
        "audio_packets": rec.audio_packets,
        "goodput_bps": media * 8 / span if span > 0 else 0.0,
        "throughput_bps": media * 8 / span if span > 0 else 0.0,
        "lost_pct": 100 * stats.frames_lost / stats.frames_expected
        if stats.frames_expected else 0.0,
        "delay_ms": delay, "jitter_ms": jitter * 1e3 if jitter is not None else None,
        "live_latency_s": live,
        "max_gap_s": gap, "max_gap_start_unix": watch.join_unix + gap_at,
        "buffer_rule": {"startup_ms": startup_ms, "rebuffer_ms": rebuffer_ms,
                        "source": BUFFER_RULE_SOURCE},
    }
    out.update(stats.to_dict())
    out.update(_viewer_keys(stats, watch))
    out["arrival_fields"] = list(ARRIVAL_FIELDS)
    out["arrivals"] = [[round(f.t, 3), round(f.pts, 3), int(f.key), f.size] for f in frames]
    return out


# --------------------------------------------------------------------------------------------
# The viewer: ffprobe as a child, read until the time is up
# --------------------------------------------------------------------------------------------


def _child_setup(mask: set[signal.Signals], parent: int) -> Callable[[], None]:
    """What ffprobe runs between fork and exec: the signal mask the parent had before it
    blocked SIGTERM/SIGINT around the fork (a mask survives exec), and death with its
    parent, so that not even a SIGKILLed viewer leaves an ffprobe behind."""
    try:
        prctl: Any = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None

    def setup() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent:
                os._exit(1)
    return setup


class Viewer:
    """Starts ffprobe, stamps its lines until the watch is over, then stops it by PID."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.join_ns = time.time_ns()
        self.t0 = time.monotonic()
        self.rec = Recording(self.t0)
        self.proc: subprocess.Popen[bytes] | None = None
        self.argv = ffprobe_argv(args.url, args.ffprobe)
        self.started_t: float | None = None
        self.stop_t: float | None = None
        self.end_reason = "duration"
        self.stopped: str | None = None
        self.stderr = b""
        self.cpu_s: float | None = None
        self.rc: int | None = None
        self.live_file = LiveFile(args.live_file)

    def run(self) -> None:
        try:
            self._start()
            self._watch()
        except StopRequestedError as exc:
            self.stopped = self.end_reason = str(exc)
        except OSError as exc:  # no ffprobe, or the ready file could not be written
            self.end_reason = "error"
            self.stderr = str(exc).encode()
        finally:
            ignore_signals()  # from here on nothing may cut the clean-up short
            self.stop_t = time.monotonic() - self.t0
            self.stop()

    def _start(self) -> None:
        """Fork ffprobe with SIGTERM/SIGINT blocked, so that a stop request cannot land
        between the fork and ``self.proc`` knowing the child's PID."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, preexec_fn=_child_setup(old, os.getpid()))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        self.started_t = time.monotonic() - self.t0
        if self.args.ready_file:
            Path(self.args.ready_file).write_text(f"{self.proc.pid}\n")

    def _watch(self) -> None:
        """Read ffprobe's stdout and stderr until ``--duration`` is over or it exits."""
        assert self.proc is not None and self.proc.stdout and self.proc.stderr
        deadline = self.t0 + self.args.duration
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout.fileno(), selectors.EVENT_READ, "out")
            sel.register(self.proc.stderr.fileno(), selectors.EVENT_READ, "err")
            while sel.get_map():
                now = time.monotonic()
                left = deadline - now
                if left <= 0:
                    return
                if self.live_file.due(now):
                    self.write_live(now)
                for key, _ in sel.select(self.live_file.wait_s(now, left)):
                    data = os.read(key.fd, 1 << 16)
                    mono, wall = time.monotonic(), time.time_ns()
                    if not data:
                        sel.unregister(key.fd)
                    elif key.data == "out":
                        self.rec.feed(data, mono, wall)
                    else:
                        self.stderr = (self.stderr + data)[-STDERR_KEEP:]
        self.end_reason = "eof"  # ffprobe closed its output: it is exiting

    def stop(self) -> None:
        """Stop ffprobe by its PID (SIGTERM, then SIGKILL), reap it, keep its CPU time."""
        proc = self.proc
        if proc is None or self.rc is not None:
            return
        self.cpu_s = cpu_seconds(proc.pid)  # before reaping: /proc forgets it then
        if self.end_reason == "eof":  # it closed its output: let it finish exiting
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1.0)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.rc = proc.returncode
        assert proc.stderr is not None and proc.stdout is not None
        with contextlib.suppress(OSError):
            os.set_blocking(proc.stderr.fileno(), False)
            self.stderr = (self.stderr + (proc.stderr.read() or b""))[-STDERR_KEEP:]
        proc.stdout.close()
        proc.stderr.close()
        if self.end_reason == "eof" and self.rc != 0:
            self.end_reason = "error"

    def write_live(self, now: float, final: bool = False) -> None:
        """The live file (``--live-file``): the model over the frames so far, the watch
        ending ``now``; ``final``, the summary's own watch, once the viewer has stopped."""
        a = self.args
        if self.live_file.path is None:
            return
        if final:
            stop = self.stop_t if self.stop_t is not None else now - self.t0
            watch = Watch(self.join_ns / 1e9, stop, a.duration, self.end_reason)
            now = self.t0 + stop
        else:
            watch = Watch(self.join_ns / 1e9, now - self.t0, a.duration, "duration")
        self.live_file.write(live(self.rec, agent="rtmpview", stream_id=a.stream_id,
                                  fps=a.fps, startup_ms=a.startup_ms,
                                  rebuffer_ms=a.rebuffer_ms, watch=watch, t0=self.t0,
                                  now=now, final=final), now)

    def summary(self) -> dict[str, Any]:
        a = self.args
        stop = self.stop_t if self.stop_t is not None else time.monotonic() - self.t0
        watch = Watch(self.join_ns / 1e9, stop, a.duration, self.end_reason)
        stream = summarize(self.rec, stream_id=a.stream_id, fps=a.fps,
                           startup_ms=a.startup_ms, rebuffer_ms=a.rebuffer_ms, watch=watch,
                           publish_epoch=a.publish_epoch)
        errors = [self.stderr.decode(errors="replace").strip()] if self.stderr.strip() else []
        if self.rec.unparsed:
            errors.append(f"{self.rec.unparsed} ffprobe lines not understood")
        ran = stop - self.started_t if self.started_t is not None else None
        out: dict[str, Any] = {
            "schema": playout.SUMMARY_SCHEMA, "tool": "play", "agent": "rtmpview",
            "media": "real", "protocol": "rtmp", "proto": "tcp", "url": a.url,
            "startup_ms": a.startup_ms, "rebuffer_ms": a.rebuffer_ms,
            "started_unix": self.join_ns / 1e9, "publish_epoch": a.publish_epoch,
            "stopped_by": self.stopped, "errors": errors,
            "ffprobe": {"argv": self.argv, "pid": self.proc.pid if self.proc else None,
                        "returncode": self.rc, "started_s": self.started_t,
                        "cpu_s": self.cpu_s,
                        "cpu_pct": 100 * self.cpu_s / ran if self.cpu_s is not None and ran
                        else None},
            "streams": [stream],
        }
        out.update(playout.stream_totals(out))
        return out


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab.agents.rtmpview", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_viewer_arguments(p, url_help="rtmp://server[:port]/app/stream",
                         ready_help="written (ffprobe's PID) once ffprobe has started")
    p.add_argument("--fps", type=positive_float, required=True,
                   help="the stream's nominal frame rate: the playout clock, and what a PTS "
                        "gap is measured in")
    p.add_argument("--startup-ms", type=float, default=DEFAULT_STARTUP_MS,
                   help="media buffered before playback starts (default "
                        f"{DEFAULT_STARTUP_MS:g}: {BUFFER_RULE_SOURCE})")
    p.add_argument("--rebuffer-ms", type=float, default=DEFAULT_REBUFFER_MS,
                   help="media buffered again before playback resumes after a stall "
                        f"(default {DEFAULT_REBUFFER_MS:g}: {BUFFER_RULE_SOURCE})")
    p.add_argument("--ffprobe", default="ffprobe", help="the ffprobe program (default: PATH)")
    return p


def main(argv: list[str] | None = None) -> int:
    catch_signals()
    args = build_parser().parse_args(argv)
    viewer = Viewer(args)
    viewer.run()
    viewer.write_live(time.monotonic(), final=True)
    write_json({**viewer.summary(), "cpu_s": cpu_s(), "live_writes": viewer.live_file.writes},
               args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
