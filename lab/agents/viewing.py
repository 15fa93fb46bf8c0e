"""What a real viewer saw, from its video frames' arrivals: the RTMP viewer's
(``lab.agents.rtmpview``) and the HLS viewer's (``lab.agents.hlsview``) one account.

Both record each video frame's arrival and presentation time (``Recording``); from those,
the lab's player model (:func:`lab.agents.playout.simulate_playout`) under one buffer rule
gives startup delay, stalls, rebuffering ratio, frames dropped and live latency
(``summarize``), and the same model over the frames so far is a viewer's live state
(``live``). Why one module: the two protocols deliver frames differently, but what a viewer
saw of them must be judged the same way, so their stall counts can be compared.

The buffer rule is ExoPlayer's (media3 ``DefaultLoadControl``: 1000 ms buffered to start,
2000 ms to resume after a stall): numeric, documented, and one real player applies it to
both RTMP and HLS.

This runs inside hosts: standard library and ``lab.agents`` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from statistics import median
from typing import Any

from lab.agents import playout
from lab.agents.common import live_state, percentile

#: ExoPlayer media3 DefaultLoadControl: DEFAULT_BUFFER_FOR_PLAYBACK_MS (media buffered before
#: playback starts) and DEFAULT_BUFFER_FOR_PLAYBACK_AFTER_REBUFFER_MS (before it resumes).
DEFAULT_STARTUP_MS = 1000.0
DEFAULT_REBUFFER_MS = 2000.0
BUFFER_RULE_SOURCE = "ExoPlayer media3 DefaultLoadControl"
#: A PTS going back more than this (or forward more than ``PTS_JUMP_FORWARD_S``) is a new
#: timeline (a publisher that reconnected), not reordering or dropped frames.
PTS_JUMP_BACK_S, PTS_JUMP_FORWARD_S = 1.0, 60.0
#: The arrival list's columns, one row per video frame.
ARRIVAL_FIELDS = ("t_s", "pts_s", "key", "bytes")
#: The player model's timeline step (its default), seconds.
TIMELINE_STEP_S = 1.0


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


def live_watch(join_unix: float, t0: float, now: float, duration: float,
               stop_s: float | None, end_reason: str, final: bool) -> tuple[Watch, float]:
    """The watch a live write models, and the moment it speaks for: so far, the watch
    ending ``now``; ``final`` (the viewer has stopped), the summary's own watch, ending
    when the viewer stopped (``stop_s`` since ``t0``, or ``now`` if it never said)."""
    if final:
        stop = stop_s if stop_s is not None else now - t0
        return Watch(join_unix, stop, duration, end_reason), t0 + stop
    return Watch(join_unix, now - t0, duration, "duration"), now


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
