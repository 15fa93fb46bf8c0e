"""Live-stream media on the emulated network, and the viewer's player model that counts stalls.

A congested uplink is invisible in "every link is up" and barely visible in a throughput
average; a viewer notices it as *stalls*: playback freezes while the player rebuffers. So the
lab measures streams the way a player experiences them. ``lab.agents.streamer`` moves the frames
(sockets, pacing, JSON); everything here is pure Python, so it can be unit-tested on synthetic
traces without root or packets:

* the wire format: a small header per frame (stream id, frame sequence number, send time,
  frame length; TCP frames back to back, UDP frames cut into datagrams of at most 1400 bytes);
* receive-side bookkeeping: a TCP byte-stream parser and a UDP fragment reassembler that record
  when each frame *completely* arrived;
* :func:`simulate_playout`, the playout-buffer model (startup, playing, stalls, late and lost
  frames), plus delay percentiles and RFC 3550 interarrival jitter;
* reading the JSON summaries back (:func:`read_summary`, :func:`stream_totals`).

Times in the model are seconds on one clock. Sender and player run on the same machine in
different network namespaces, so their wall clocks (``time.time_ns()``) agree and one-way delay
is simply arrival minus send time.
"""

from __future__ import annotations

import heapq
import json
import math
import struct
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from lab.agents.common import percentile

#: Version of the JSON summaries written by ``lab.agents.streamer``.
SUMMARY_SCHEMA = 1

INF = math.inf
#: Arrival "at" the playout instant counts as in time: 1 ns, the clocks' resolution, absorbs
#: float rounding in the schedule so that ties do not flip into stalls.
_EPS = 1e-9

# --------------------------------------------------------------------------------------------
# Wire format
# --------------------------------------------------------------------------------------------

#: Marks a media frame; ``END_MAGIC`` marks the end of a stream (``seq`` = frames sent).
FRAME_MAGIC = b"FL"
END_MAGIC = b"FE"
#: TCP: magic, frame rate x100, stream id, frame seq, send time (ns), frame length; then
#: ``length`` media bytes. The length prefix is what lets the player cut the byte stream.
FRAME_HEADER = struct.Struct("!2sHIIQI")
#: UDP: the same fields plus fragment index and fragment count, in every datagram.
DGRAM_HEADER = struct.Struct("!2sHIIQIHH")
#: Largest UDP payload we send: one datagram fits a 1500-byte MTU with IP/UDP headers to spare.
MAX_DATAGRAM = 1400
DGRAM_PAYLOAD = MAX_DATAGRAM - DGRAM_HEADER.size


@dataclass(frozen=True)
class Header:
    """One decoded frame (TCP) or fragment (UDP) header; ``end`` marks an end-of-stream."""

    end: bool
    fps: float
    stream_id: int
    seq: int
    send_ns: int
    length: int
    frag_index: int = 0
    frag_count: int = 1


def _fps_centi(fps: float) -> int:
    centi = round(fps * 100)
    if not 0 < centi <= 0xFFFF:
        raise ValueError(f"frame rate {fps} is outside 0.01..655.35 fps")
    return centi


def pack_frame_header(stream_id: int, seq: int, send_ns: int, length: int, fps: float,
                      *, end: bool = False) -> bytes:
    """The 24-byte header in front of each TCP frame (or the end-of-stream marker)."""
    magic = END_MAGIC if end else FRAME_MAGIC
    return FRAME_HEADER.pack(magic, _fps_centi(fps), stream_id, seq, send_ns, length)


def unpack_frame_header(buf: bytes | bytearray | memoryview) -> Header:
    """Decode a TCP frame header; a wrong magic means the byte stream lost its framing."""
    magic, centi, sid, seq, send_ns, length = FRAME_HEADER.unpack(buf)
    if magic not in (FRAME_MAGIC, END_MAGIC):
        raise ValueError(f"bad frame magic {magic!r}")
    return Header(magic == END_MAGIC, centi / 100, sid, seq, send_ns, length)


def pack_datagram_header(stream_id: int, seq: int, send_ns: int, length: int, fps: float,
                         frag_index: int, frag_count: int, *, end: bool = False) -> bytes:
    """The 28-byte header in every UDP datagram: which frame, which piece of it, when sent."""
    magic = END_MAGIC if end else FRAME_MAGIC
    return DGRAM_HEADER.pack(magic, _fps_centi(fps), stream_id, seq, send_ns, length,
                             frag_index, frag_count)


def unpack_datagram(buf: bytes | bytearray | memoryview) -> tuple[Header, int]:
    """Decode a UDP datagram: its header and how many media bytes it carried."""
    if len(buf) < DGRAM_HEADER.size:
        raise ValueError(f"datagram of {len(buf)} bytes is shorter than its header")
    magic, centi, sid, seq, send_ns, length, idx, count = DGRAM_HEADER.unpack_from(buf)
    if magic not in (FRAME_MAGIC, END_MAGIC):
        raise ValueError(f"bad datagram magic {magic!r}")
    return (Header(magic == END_MAGIC, centi / 100, sid, seq, send_ns, length, idx, count),
            len(buf) - DGRAM_HEADER.size)


def fragment_sizes(length: int, payload: int = DGRAM_PAYLOAD) -> list[int]:
    """Media bytes in each datagram of a frame of ``length`` bytes (all full but the last)."""
    if length <= 0:
        raise ValueError("a frame needs at least one byte")
    full, rest = divmod(length, payload)
    return [payload] * full + ([rest] if rest else [])


def frame_sizes(rate_bps: float, fps: float, count: int) -> list[int]:
    """Sizes of ``count`` constant-bitrate frames whose sum is exact at any rate.

    Frame i gets ``floor((i+1)·B) - floor(i·B)`` bytes with ``B`` = bytes per frame, so a
    rate that is not a whole number of bytes per frame still averages to exactly ``rate_bps``
    instead of drifting by the rounding error every frame.
    """
    per_frame = rate_bps / 8 / fps
    if per_frame < 1:
        raise ValueError(f"{rate_bps} bit/s at {fps} fps is less than one byte per frame")
    return [math.floor((i + 1) * per_frame) - math.floor(i * per_frame) for i in range(count)]


# --------------------------------------------------------------------------------------------
# Receive-side bookkeeping
# --------------------------------------------------------------------------------------------


class FrameParser:
    """Cuts a TCP byte stream into frames and says when each frame's last byte arrived.

    A frame counts as arrived only when all of it is there: a player cannot decode half a
    frame. Media bytes are counted, not kept.
    """

    def __init__(self) -> None:
        self._head = bytearray()
        self._header: Header | None = None
        self._remaining = 0

    def feed(self, data: bytes | bytearray | memoryview, now_ns: int) -> list[Header]:
        """Consume ``data`` read at ``now_ns``; return the headers of the frames it completed.

        End-of-stream markers are returned too (``Header.end``), in stream order.
        """
        done: list[Header] = []
        view = memoryview(data)
        pos, n = 0, len(view)
        while pos < n:
            if self._header is None:
                take = min(FRAME_HEADER.size - len(self._head), n - pos)
                self._head += view[pos:pos + take]
                pos += take
                if len(self._head) < FRAME_HEADER.size:
                    break
                self._header = unpack_frame_header(self._head)
                self._head.clear()
                self._remaining = 0 if self._header.end else self._header.length
            take = min(self._remaining, n - pos)
            self._remaining -= take
            pos += take
            if self._remaining == 0:
                done.append(self._header)
                self._header = None
        return done

    @property
    def partial(self) -> bool:
        """Whether a frame was cut off mid-way (meaningful once the stream has ended)."""
        return self._header is not None or bool(self._head)


@dataclass
class FrameArrival:
    """When one frame was sent and when it was complete at the player."""

    seq: int
    send_ns: int
    arrival_ns: int
    length: int


@dataclass
class StreamRecord:
    """Everything the player saw of one stream; :meth:`summarize` turns it into numbers.

    Works for both transports: TCP hands over whole frames (:meth:`add_frame`), UDP single
    fragments (:meth:`add_fragment`, which reassembles).
    """

    stream_id: int
    proto: str
    fps: float = 0.0
    first_ns: int | None = None
    last_ns: int | None = None
    last_media_ns: int | None = None
    end_ns: int | None = None
    end_reason: str | None = None
    frames_sent: int | None = None
    frames: dict[int, FrameArrival] = field(default_factory=dict)
    bytes_received: int = 0
    datagrams: int = 0
    duplicates: int = 0
    _pieces: dict[int, tuple[int, set[int], int]] = field(default_factory=dict, repr=False)

    def _touch(self, header: Header, now_ns: int) -> None:
        if self.first_ns is None:
            self.first_ns = now_ns
        self.last_ns = now_ns
        if header.fps:
            self.fps = header.fps
        if not header.end:
            self.last_media_ns = now_ns

    def add_frame(self, header: Header, now_ns: int) -> None:
        """A whole TCP frame (or the end marker) arrived at ``now_ns``."""
        self._touch(header, now_ns)
        if header.end:
            self.frames_sent = header.seq
            return
        self.bytes_received += header.length
        if header.seq in self.frames:
            self.duplicates += 1
            return
        self.frames[header.seq] = FrameArrival(header.seq, header.send_ns, now_ns, header.length)

    def add_fragment(self, header: Header, payload_len: int, now_ns: int) -> bool:
        """One UDP datagram arrived; return True if it completed its frame."""
        self._touch(header, now_ns)
        self.datagrams += 1
        if header.end:
            self.frames_sent = header.seq
            return False
        if header.seq in self.frames:
            self.duplicates += 1
            return False
        length, got, _ = self._pieces.get(header.seq, (header.length, set(), 0))
        if header.frag_index in got or not 0 <= header.frag_index < header.frag_count:
            self.duplicates += 1
            return False
        got.add(header.frag_index)
        self.bytes_received += payload_len
        if len(got) < header.frag_count:
            self._pieces[header.seq] = (length, got, header.frag_count)
            return False
        self._pieces.pop(header.seq, None)
        self.frames[header.seq] = FrameArrival(header.seq, header.send_ns, now_ns, length)
        return True

    def end(self, reason: str, now_ns: int) -> None:
        """The stream is over (end marker, EOF, idle, timeout): nothing more will be played."""
        if self.end_ns is None:
            self.end_ns = now_ns
            self.end_reason = reason

    @property
    def ended(self) -> bool:
        return self.end_ns is not None

    def fragments_missing(self) -> int:
        """Datagrams of partly received frames that never came (UDP loss inside frames)."""
        return sum(count - len(got) for _, got, count in self._pieces.values())

    def summarize(self, startup_ms: float, rebuffer_ms: float,
                  fps: float | None = None) -> dict[str, Any]:
        """The per-stream JSON entry: playout (stalls), loss, goodput, delay and jitter.

        ``goodput_bps`` counts whole frames only (what a decoder can use); ``throughput_bps``
        every media byte received, partial frames included: over UDP the gap between the two
        is the capacity spent on frames that lost a fragment. Both are over the stream's
        receive span. Delay and jitter are per whole frame: send time to last byte.
        Times are relative to the first byte or datagram of the stream (the viewer "joins"
        then), so ``startup_delay_s`` is how long that viewer waited for the picture.
        """
        rate = fps or self.fps
        if rate <= 0:
            raise ValueError(f"stream {self.stream_id}: frame rate unknown (pass --fps)")
        first = self.first_ns if self.first_ns is not None else 0
        arrivals = sorted(self.frames.values(), key=lambda f: f.arrival_ns)
        expected = self.frames_sent
        if expected is None:
            expected = max(self.frames) + 1 if self.frames else 0
        eos = None if self.end_ns is None else (self.end_ns - first) / 1e9
        stats = simulate_playout([(f.seq, (f.arrival_ns - first) / 1e9) for f in arrivals],
                                 rate, startup_ms, rebuffer_ms, total_frames=expected,
                                 join_time=0.0, eos_time=eos)
        delays_ms = [(f.arrival_ns - f.send_ns) / 1e6 for f in arrivals]
        jitter = rfc3550_jitter([(f.send_ns / 1e9, f.arrival_ns / 1e9) for f in arrivals])
        media_bytes = sum(f.length for f in arrivals)
        # N frames take N frame periods: the span runs one period past the last media byte.
        last = self.last_media_ns
        span = (last - first) / 1e9 + 1 / rate if last is not None else 0.0
        out: dict[str, Any] = {
            "stream_id": self.stream_id,
            "proto": self.proto,
            "fps": rate,
            "first_arrival_unix": first / 1e9,
            "end_reason": self.end_reason,
            "frames_sent": self.frames_sent,
            "frames_received": len(self.frames),
            "bytes_received": self.bytes_received,
            "media_bytes": media_bytes,
            "goodput_bps": media_bytes * 8 / span if span > 0 else 0.0,
            "throughput_bps": self.bytes_received * 8 / span if span > 0 else 0.0,
            "lost_pct": 100 * stats.frames_lost / expected if expected else 0.0,
            "delay_ms": {"p50": percentile(delays_ms, 50), "p99": percentile(delays_ms, 99),
                         "mean": sum(delays_ms) / len(delays_ms) if delays_ms else None,
                         "max": max(delays_ms, default=None)},
            "jitter_ms": jitter * 1e3 if jitter is not None else None,
            "duplicates": self.duplicates,
        }
        # The longest silence between two complete frames: a failover's outage as this
        # stream saw it (a 25 fps stream normally shows 40 ms).
        gaps = [(b.arrival_ns - a.arrival_ns, a.arrival_ns) for a, b in pairwise(arrivals)]
        gap_ns, gap_at = max(gaps, default=(0, first))
        out["max_gap_s"] = gap_ns / 1e9
        out["max_gap_start_unix"] = gap_at / 1e9
        if self.proto == "udp":
            out["datagrams"] = self.datagrams
            out["fragments_missing"] = self.fragments_missing()
        out.update(stats.to_dict())
        return out


# --------------------------------------------------------------------------------------------
# The player model
# --------------------------------------------------------------------------------------------


@dataclass
class StallEvent:
    """Playback froze at ``start_s`` for ``duration_s`` because frame ``seq`` was not there."""

    start_s: float
    duration_s: float
    seq: int


@dataclass
class TimelinePoint:
    """The player at one sample time: media seconds buffered and what it was doing."""

    t: float
    buffer_s: float
    state: str  # "startup" | "playing" | "stalled" | "ended"
    stalled: bool


@dataclass
class PlayoutStats:
    """What a viewer experienced. Times are relative to the join time.

    Every expected frame ends up in exactly one of: played (on time, or late after a stall),
    skipped (missing at its playout time while a later frame was buffered: concealed) or
    never reached (the stream ended before it). ``frames_lost`` counts frames that never
    completely arrived; ``frames_late`` frames that did arrive, but after the player needed
    them (a frame that caused a stall and was then played, or one that came after it had been
    skipped). The two never overlap.
    """

    fps: float
    frames_expected: int
    frames_arrived: int
    frames_played: int
    frames_skipped: int
    frames_late: int
    frames_lost: int
    started: bool
    startup_delay_s: float | None
    stalls: int
    stall_s: float
    play_end_s: float | None
    stall_events: list[StallEvent] = field(default_factory=list)
    timeline: list[TimelinePoint] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _frames_for(ms: float, fps: float) -> int:
    """Whole frames needed to hold ``ms`` of media (at least one: nothing plays from nothing)."""
    return max(1, math.ceil(ms * fps / 1000 - 1e-9))


def simulate_playout(arrivals: Iterable[tuple[int, float]], fps: float,
                     startup_ms: float = 1000.0, rebuffer_ms: float = 500.0, *,
                     total_frames: int | None = None, first_seq: int = 0,
                     join_time: float | None = None, eos_time: float | None = None,
                     timeline_step_s: float = 1.0) -> PlayoutStats:
    """Play a stream from its frame arrival times and say how often, and how long, it stalled.

    ``arrivals`` are ``(frame_seq, time_s)`` pairs, the time a frame was *completely* there
    (duplicates: the first counts). The player is causal, i.e. it only uses what it could
    know at each instant:

    * **startup**: playback starts when ``startup_ms`` of media is buffered (frames with a
      sequence number not yet played, counted whole);
    * **playing**: one frame every ``1/fps`` s. A frame that is there at its playout time is
      played. A missing frame while a *later* frame is already buffered is skipped
      (concealed; its slot still takes ``1/fps``, the playout clock follows the media
      clock): that is how UDP loss passes without stalling forever;
    * **stall**: a missing frame with an empty buffer freezes playback until ``rebuffer_ms``
      of media is buffered again, or until the stream is known to have ended (then whatever
      is there plays). A stream that keeps sending but completes no frame (every frame lost
      a fragment) is therefore one long stall, as the viewer sees it;
    * **end**: once the stream is known to have ended and no frame at or after the next one
      will arrive, playback is over; an empty buffer after that point is not a stall.

    ``total_frames`` (from the sender's end-of-stream marker) lets lost frames at the tail
    count; without it the highest sequence seen bounds the stream. ``join_time`` (default:
    first arrival) is when the viewer started waiting; ``eos_time`` (default: last arrival)
    is when the player learnt that the stream had ended.
    """
    if not fps > 0:
        raise ValueError("fps must be positive")
    if startup_ms < 0 or rebuffer_ms < 0:
        raise ValueError("startup_ms and rebuffer_ms must be >= 0")
    best: dict[int, float] = {}  # each frame's first complete arrival, by index
    for seq, t in arrivals:
        i = seq - first_seq
        if i < 0 or (total_frames is not None and i >= total_frames) or math.isnan(t):
            continue
        if t < best.get(i, INF):
            best[i] = t
    n = total_frames if total_frames is not None else (max(best) + 1 if best else 0)
    if not best:
        return PlayoutStats(fps, n, 0, 0, 0, 0, n, False, None, 0, 0.0, None)
    arr = [best.get(i, INF) for i in range(n)]
    join = min(best.values()) if join_time is None else join_time
    eos = max(best.values()) if eos_time is None else max(eos_time, max(best.values()))
    period = 1.0 / fps
    play_start = _buffered_at(arr, 0, _frames_for(startup_ms, fps), join, eos)
    run = _play(arr, period, play_start, _frames_for(rebuffer_ms, fps), eos)
    events = [StallEvent(t - join, resume - t, first_seq + k) for t, resume, k in run.stalls]
    stats = PlayoutStats(
        fps=fps, frames_expected=n, frames_arrived=len(best), frames_played=run.played,
        frames_skipped=run.skipped, frames_late=sum(run.late), frames_lost=arr.count(INF),
        started=True, startup_delay_s=play_start - join, stalls=len(events),
        stall_s=sum((e.duration_s for e in events), 0.0), play_end_s=run.end - join,
        stall_events=events)
    if timeline_step_s > 0:
        stats.timeline = _timeline(arr, run.consumed, events, join, play_start, run.end, period,
                                   timeline_step_s)
    return stats


def _buffered_at(arr: Sequence[float], k: int, need: int, now: float, eos: float) -> float:
    """When ``need`` frames at or after ``k`` are there (or the stream is known over)."""
    times = heapq.nsmallest(need, (t for t in arr[k:] if t < INF))
    return max(now, times[-1] if len(times) == need else eos)


@dataclass
class _Playback:
    """What the playout loop did; stalls are ``(start, resume, frame index)``, not relative."""

    played: int = 0
    skipped: int = 0
    late: list[bool] = field(default_factory=list)
    consumed: list[float] = field(default_factory=list)
    stalls: list[tuple[float, float, int]] = field(default_factory=list)
    end: float = 0.0


def _play(arr: Sequence[float], period: float, play_start: float, need_rebuffer: int,
          eos: float) -> _Playback:
    """Walk the frame slots from ``play_start``: play, skip, stall or end (as
    :func:`simulate_playout` says). The clock is a segment start plus whole periods: no drift."""
    n = len(arr)
    sufmin = [INF] * (n + 1)  # sufmin[k]: earliest arrival of any frame >= k
    for i in range(n - 1, -1, -1):
        sufmin[i] = min(arr[i], sufmin[i + 1])
    run = _Playback(late=[False] * n)
    k = 0
    seg_t, seg_k = play_start, 0  # playing since seg_t, from frame seg_k
    while k < n:
        t = seg_t + (k - seg_k) * period
        a = arr[k]
        if a <= t + _EPS:
            run.played += 1
        elif sufmin[k + 1] <= t + _EPS:
            run.skipped += 1
            run.late[k] = a < INF
        elif sufmin[k] == INF and t >= eos:
            break
        else:
            resume = _buffered_at(arr, k, need_rebuffer, t, eos)
            run.stalls.append((t, resume, k))
            run.late[k] = a < INF
            seg_t, seg_k = resume, k
            continue
        run.consumed.append(t)
        k += 1
    run.end = seg_t + (k - seg_k) * period
    return run


def _timeline(arr: Sequence[float], consumed: Sequence[float], events: Sequence[StallEvent],
              join: float, play_start: float, play_end: float, period: float,
              step: float) -> list[TimelinePoint]:
    """Sample buffer level and player state every ``step`` s from the join to the end."""
    points: list[TimelinePoint] = []
    stalls = [(join + e.start_s, join + e.start_s + e.duration_s) for e in events]
    i = 0
    while True:
        s = join + i * step
        done = bisect_right(consumed, s + _EPS)  # frames played or skipped by time s
        level = sum(1 for a in arr[done:] if a <= s + _EPS) * period
        stalled = any(a <= s < b for a, b in stalls)
        if s < play_start:
            state = "startup"
        elif stalled:
            state = "stalled"
        elif s >= play_end:
            state = "ended"
        else:
            state = "playing"
        points.append(TimelinePoint(round(s - join, 6), round(level, 6), state, stalled))
        if s >= play_end:
            return points
        i += 1


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------


def rfc3550_jitter(samples: Sequence[tuple[float, float]]) -> float | None:
    """RFC 3550 (A.8) interarrival jitter over ``(send_s, arrival_s)`` in arrival order.

    ``J += (|D| - J) / 16`` with ``D`` the change in transit time between consecutive
    arrivals: a smoothed measure of how unevenly the network delivers, independent of any
    constant clock offset. None with fewer than two samples.
    """
    if len(samples) < 2:
        return None
    jitter = 0.0
    prev = samples[0][1] - samples[0][0]
    for send, arrival in samples[1:]:
        transit = arrival - send
        jitter += (abs(transit - prev) - jitter) / 16
        prev = transit
    return jitter


# --------------------------------------------------------------------------------------------
# Reading summaries back
# --------------------------------------------------------------------------------------------


def read_summary(path: str | Path, tool: str | None = None) -> dict[str, Any]:
    """Load a streamtool JSON summary, refusing another schema or the wrong tool's file."""
    data = json.loads(Path(path).read_text())
    if data.get("schema") != SUMMARY_SCHEMA:
        raise ValueError(f"{path}: summary schema {data.get('schema')!r}, "
                         f"expected {SUMMARY_SCHEMA}")
    if tool is not None and data.get("tool") != tool:
        raise ValueError(f"{path}: a {data.get('tool')!r} summary, expected {tool!r}")
    return data


def stream_totals(player_summary: dict[str, Any]) -> dict[str, Any]:
    """Stalls, stall seconds and lost share over all streams of a player summary.

    Shaped like the per-phase entry the streaming scenario reports (``stalls``, ``stall_s``,
    ``streams_lost_pct``): lost share is of all expected frames, so a big stream weighs more.
    """
    streams = player_summary.get("streams", [])
    expected = sum(s["frames_expected"] for s in streams)
    lost = sum(s["frames_lost"] for s in streams)
    return {"stream_count": len(streams),
            "stalls": sum(s["stalls"] for s in streams),
            "stall_s": sum((s["stall_s"] for s in streams), 0.0),
            "streams_lost_pct": 100 * lost / expected if expected else 0.0}
