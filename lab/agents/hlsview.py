"""A real HLS viewer, run inside a host's namespace: it loads a live playlist and its segments
over HTTP the way a live HLS player does, and times what arrived.

``python -m lab.agents.hlsview --url http://cdn:8080/hls/big1.m3u8 --duration 30 --out v.json``

What it does, and why (RFC 8216, and hls.js 1.x where the RFC leaves a choice):

* **playlist reloads** (RFC 8216 §6.3.4): after a load that found the playlist changed (or
  the first one), the next starts one target duration after the previous one *began*; after
  a load that found it unchanged, half a target duration after. A playlist that is not there
  yet (nginx-rtmp writes it only once the first fragment is closed) is asked for again every
  ``NOT_FOUND_RETRY_S``.
* **where it starts** (RFC 8216 §6.3.3, hls.js ``liveSyncDurationCount`` 3): at the last
  segment that starts at least three target durations before the playlist's end. A playlist
  that does not yet hold three target durations has no such segment, so the viewer waits for
  one that does (hls.js does the same with ``initialLiveManifestSize`` 3, which its page in
  ``lab/agents/hlsjs/`` sets; hls.js's default of 1 starts at the live edge and stalls).
* **segments in order**, one at a time over one keep-alive HTTP connection, as hls.js loads
  fragments; each new one as soon as the playlist lists it. A segment that fell out of the
  sliding window before it was fetched (the viewer fell more than a window behind) is
  skipped: the viewer jumps back to three target durations from the live edge, as hls.js
  does. A segment that the server no longer has (404) is skipped too.
* **per segment**: sequence number, ``EXTINF``, request, first byte and completion wall
  times (``time.time()``), bytes, and what is in it: the MPEG-TS is parsed (PAT, PMT, the
  PES headers of the video and audio PIDs) for every video frame's PTS, its size and the
  random-access flag (:mod:`lab.agents.mpegts`), so presentation time is the stream's own,
  not assumed from ``EXTINF``.
* **the player** is the lab's model (:func:`lab.agents.playout.simulate_playout`, through
  :func:`lab.agents.viewing.summarize`, so the summary has the RTMP viewer's keys): every
  frame of a segment arrives when the segment's last byte did (a segment is appended whole,
  as hls.js appends it), on the frame clock its PTS gives. The buffer rule is ExoPlayer's
  (media3 ``DefaultLoadControl``: start at 1.0 s buffered, resume after a stall at 2.0 s),
  so with 1 s segments playback starts when the first segment is in, and a stall lasts until
  two more seconds of segments are. Stalls are counted as the RTMP viewer counts them; a
  stream whose segments stop while the viewer watches ends in a stall (it is live), one whose
  playlist says ``#EXT-X-ENDLIST`` ends (``starved_s``, not a stall).

Times in the summary are seconds since this viewer started (the join). Live latency
(``live_latency_s``) needs ``--publish-epoch``, the wall-clock time the publisher sent PTS 0;
nginx-rtmp writes every timestamp into its TS segments ``hls_muxdelay`` (0.7 s, its default)
later than the RTMP timestamp, which ``--pts-offset`` takes back out (frames' ``pts_s`` in the
summary are on the publisher's clock; the segments' ``pts_s`` are the TS's own).

With ``--live-file PATH`` the viewer also rewrites ``PATH`` about every 0.5 s while it
watches, with its player's state so far (the RTMP viewer's live file, from the same model:
see :mod:`lab.agents.rtmpview`), and once more from the summary's model when it stops. It is
written between requests: while one segment is still loading (seconds, when the link is
congested) the file keeps its last state, which the lab shows with its time.

On SIGTERM/SIGINT the viewer stops and still writes what it has. It starts no process.

This runs inside hosts: standard library and ``lab.agents`` only.
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from lab.agents import mpegts, playout, viewing
from lab.agents.common import (
    LiveFile,
    StopRequestedError,
    add_viewer_arguments,
    catch_signals,
    ignore_signals,
    percentile,
    positive_float,
    write_json,
)

#: The buffer rule: the RTMP viewer's (ExoPlayer media3 DefaultLoadControl).
DEFAULT_STARTUP_MS = viewing.DEFAULT_STARTUP_MS
DEFAULT_REBUFFER_MS = viewing.DEFAULT_REBUFFER_MS
#: RFC 8216 §6.3.3 / hls.js liveSyncDurationCount: start this many target durations back.
LIVE_SYNC_COUNT = 3
#: A playlist that is not there (404, refused) is asked for again this often (s).
NOT_FOUND_RETRY_S = 0.5
#: nginx-rtmp's ``hls_muxdelay`` default: TS timestamps are the RTMP ones plus this (s).
NGINX_MUXDELAY_S = 0.7
#: One request may take at most this long (s), the watch's end permitting.
REQUEST_TIMEOUT_S = 10.0
#: The frame rate when no two video frames were seen to measure it from.
FALLBACK_FPS = 25.0
READ_CHUNK = 1 << 16


# --------------------------------------------------------------------------------------------
# The playlist
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """One ``#EXTINF`` entry: its media sequence number, duration, absolute URL."""

    sn: int
    duration: float
    url: str
    discontinuity: bool = False


@dataclass
class Playlist:
    """A media playlist as the viewer needs it."""

    target_duration: float
    media_sequence: int
    segments: list[Segment] = field(default_factory=list)
    ended: bool = False

    @property
    def last_sn(self) -> int:
        return self.segments[-1].sn if self.segments else self.media_sequence - 1

    def live_start(self, count: int = LIVE_SYNC_COUNT) -> Segment | None:
        """The last segment that starts at least ``count`` target durations before the end
        (RFC 8216 §6.3.3); None while the playlist holds less than that. A playlist that has
        ended (VOD-like) starts at its first segment."""
        if not self.segments:
            return None
        if self.ended:
            return self.segments[0]
        need, acc = count * self.target_duration, 0.0
        for seg in reversed(self.segments):
            acc += seg.duration
            if acc >= need - 1e-6:
                return seg
        return None


def parse_playlist(text: str, base_url: str) -> Playlist:
    """Parse a media playlist (RFC 8216 §4.3). Unknown tags are ignored; a master playlist
    (no ``#EXTINF``, only ``#EXT-X-STREAM-INF``) is refused."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines or lines[0] != "#EXTM3U":
        raise ValueError("not an M3U8 playlist (no #EXTM3U)")
    if any(ln.startswith("#EXT-X-STREAM-INF") for ln in lines):
        raise ValueError("a master playlist: give the media playlist's URL")
    pl = Playlist(target_duration=0.0, media_sequence=0)
    sn, dur, disc = None, None, False
    for ln in lines[1:]:
        if ln.startswith("#EXT-X-TARGETDURATION:"):
            pl.target_duration = float(ln.split(":", 1)[1])
        elif ln.startswith("#EXT-X-MEDIA-SEQUENCE:"):
            pl.media_sequence = int(ln.split(":", 1)[1])
        elif ln.startswith("#EXTINF:"):
            dur = float(ln.split(":", 1)[1].split(",", 1)[0])
        elif ln == "#EXT-X-DISCONTINUITY":
            disc = True
        elif ln == "#EXT-X-ENDLIST":
            pl.ended = True
        elif not ln.startswith("#"):
            sn = pl.media_sequence + len(pl.segments)
            pl.segments.append(Segment(sn, dur if dur is not None else 0.0,
                                       urllib.parse.urljoin(base_url, ln), disc))
            dur, disc = None, False
    if pl.target_duration <= 0:
        pl.target_duration = max((s.duration for s in pl.segments), default=1.0) or 1.0
    return pl


# --------------------------------------------------------------------------------------------
# HTTP: one keep-alive connection, reads bounded by the watch's end
# --------------------------------------------------------------------------------------------


@dataclass
class Fetch:
    """One HTTP GET: status, body, and when it was asked for, began and ended (wall clock s
    and monotonic s)."""

    status: int | None
    body: bytes
    nbytes: int
    request_unix: float
    request_mono: float
    first_byte_unix: float | None = None
    done_unix: float | None = None
    done_mono: float | None = None
    error: str | None = None

    @property
    def complete(self) -> bool:
        return self.done_unix is not None and self.status == 200


class Http:
    """GETs on one persistent connection, reconnecting when the server closed it; every
    blocking read is bounded by ``deadline`` (monotonic)."""

    def __init__(self, base_url: str) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{base_url}: only http:// URLs")
        self.host, self.port = parts.hostname, parts.port or 80
        self.conn: http.client.HTTPConnection | None = None
        self.connects = 0

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _timeout(self, deadline: float) -> float:
        left = min(REQUEST_TIMEOUT_S, deadline - time.monotonic())
        if left <= 0:
            raise TimeoutError("the watch is over")
        return left

    def get(self, url: str, deadline: float) -> Fetch:
        parts = urllib.parse.urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        f = Fetch(None, b"", 0, time.time(), time.monotonic())
        for attempt in (0, 1):  # a kept-alive connection the server closed: once more
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection(self.host, self.port,
                                                           timeout=self._timeout(deadline))
                    self.conn.connect()
                    self.connects += 1
                assert self.conn.sock is not None
                self.conn.sock.settimeout(self._timeout(deadline))
                self.conn.request("GET", path, headers={"Cache-Control": "no-cache"})
                resp = self.conn.getresponse()
                f.first_byte_unix, f.status = time.time(), resp.status
                chunks = []
                while True:
                    self.conn.sock.settimeout(self._timeout(deadline))
                    chunk = resp.read(READ_CHUNK)
                    if not chunk:
                        break
                    chunks.append(chunk)
                f.body = b"".join(chunks)
                f.nbytes = len(f.body)
                f.done_unix, f.done_mono = time.time(), time.monotonic()
                if resp.will_close:
                    self.close()
                return f
            except (http.client.RemoteDisconnected, BrokenPipeError,
                    ConnectionResetError) as exc:
                self.close()
                if attempt or f.first_byte_unix is not None:
                    f.error = f"{type(exc).__name__}: {exc}"
                    return f
            except (OSError, http.client.HTTPException) as exc:  # refused, timed out
                self.close()
                f.error = f"{type(exc).__name__}: {exc}"
                return f
        return f


# --------------------------------------------------------------------------------------------
# The viewer
# --------------------------------------------------------------------------------------------


@dataclass
class SegmentRecord:
    """What the viewer got for one segment."""

    sn: int
    extinf: float
    url: str
    discontinuity: bool
    listed_unix: float
    fetch: Fetch | None = None
    content: mpegts.TsContent | None = None

    def to_dict(self, join: float) -> dict[str, Any]:
        f, c = self.fetch, self.content

        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - join, 4)

        vframes = c.frames if c else []
        return {
            "sn": self.sn, "duration": self.extinf, "uri": self.url.rsplit("/", 1)[-1],
            "discontinuity": self.discontinuity,
            "listed_unix": self.listed_unix,
            "request_unix": f.request_unix if f else None,
            "first_byte_unix": f.first_byte_unix if f else None,
            "done_unix": f.done_unix if f and f.complete else None,
            "listed_s": rel(self.listed_unix), "request_s": rel(f.request_unix if f else None),
            "done_s": rel(f.done_unix if f and f.complete else None),
            "fetch_s": (f.done_unix - f.request_unix) if f and f.complete and f.done_unix
            else None,
            "status": f.status if f else None, "error": f.error if f else None,
            "bytes": f.nbytes if f else 0,
            "pts_s": vframes[0].pts if vframes else None,
            "last_pts_s": vframes[-1].pts if vframes else None,
            "frames": len(vframes), "keyframes": sum(fr.key for fr in vframes),
            "audio_packets": c.audio_packets if c else 0,
        }


class Viewer:
    """Reloads the playlist and fetches segments until ``--duration`` is over."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.join_ns = time.time_ns()
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.duration
        self.http = Http(args.url)
        self.records: list[SegmentRecord] = []
        self.listed: dict[int, SegmentRecord] = {}
        self.next_sn: int | None = None
        self.playlist: Playlist | None = None
        self.reloads = 0
        self.reload_failures = 0
        self.playlist_bytes = 0
        self.target_durations: set[float] = set()
        self.skipped = 0
        self.resyncs = 0
        self.end_reason = "duration"
        self.stopped: str | None = None
        self.errors: list[str] = []
        self.stop_t: float | None = None
        self.live_file = LiveFile(args.live_file)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            if self.args.ready_file:
                Path(self.args.ready_file).write_text(f"{os.getpid()}\n")
            self._watch()
        except StopRequestedError as exc:
            self.stopped = self.end_reason = str(exc)
        except (OSError, ValueError) as exc:  # the ready file, or a URL we cannot use
            self.end_reason = "error"
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            ignore_signals()
            self.stop_t = time.monotonic() - self.t0
            self.http.close()

    def _watch(self) -> None:
        next_reload = time.monotonic()
        while time.monotonic() < self.deadline:
            self._live()
            seg = self._next_segment()
            if seg is not None:
                self._fetch(seg)
                continue
            if self.playlist is not None and self.playlist.ended and self.next_sn is not None \
                    and self.next_sn > self.playlist.last_sn:
                self.end_reason = "eof"
                return
            wait = next_reload - time.monotonic()
            if wait > 0:
                if next_reload >= self.deadline:
                    self._sleep_until(self.deadline)
                    return
                self._sleep_until(next_reload)
            next_reload = self._reload()

    def _sleep_until(self, when: float) -> None:
        """Sleep until ``when`` (monotonic), waking for the live file when it is due."""
        while (left := when - time.monotonic()) > 0:
            time.sleep(self.live_file.wait_s(time.monotonic(), left) or 0.001)
            self._live()

    def _live(self) -> None:
        now = time.monotonic()
        if self.live_file.due(now):
            self.write_live(now)

    def write_live(self, now: float, final: bool = False) -> None:
        """The live file (``--live-file``): the RTMP viewer's model over the segments in so
        far, the watch ending ``now``; ``final``: the summary's own watch, once stopped."""
        a = self.args
        if self.live_file.path is None:
            return
        rec = self.recording()
        fps, _ = self.fps(rec)
        watch, now = viewing.live_watch(self.join_ns / 1e9, self.t0, now, a.duration,
                                        self.stop_t, self.end_reason, final)
        self.live_file.write(viewing.live(rec, agent="hlsview", stream_id=a.stream_id,
                                           fps=fps, startup_ms=a.startup_ms,
                                           rebuffer_ms=a.rebuffer_ms, watch=watch,
                                           t0=self.t0, now=now, final=final), now)

    def _reload(self) -> float:
        """Load the playlist; return when (monotonic) to load it next (RFC 8216 §6.3.4)."""
        began = time.monotonic()
        old_none = self.playlist is None  # a 404 before the stream exists is no error
        f = self.http.get(self.args.url, self.deadline)
        self.reloads += 1
        self.playlist_bytes += f.nbytes
        if not f.complete:
            self.reload_failures += 1
            if time.monotonic() < self.deadline and not (f.status == 404 and old_none):
                self._error(f"playlist: {f.error or f'HTTP {f.status}'}")
            return began + NOT_FOUND_RETRY_S
        try:
            pl = parse_playlist(f.body.decode(errors="replace"), self.args.url)
        except ValueError as exc:
            self._error(f"playlist: {exc}")
            return began + NOT_FOUND_RETRY_S
        old = self.playlist
        changed = old is None or (pl.last_sn, pl.ended) != (old.last_sn, old.ended)
        self.playlist = pl
        self.target_durations.add(pl.target_duration)
        when = f.done_unix or time.time()
        for s in pl.segments:
            if s.sn not in self.listed:
                self.listed[s.sn] = SegmentRecord(s.sn, s.duration, s.url, s.discontinuity,
                                                  when)
        self._place(pl)
        return began + (pl.target_duration if changed else pl.target_duration / 2)

    def _place(self, pl: Playlist) -> None:
        """Choose where to start; jump back to the live window if we fell out of it, or if
        the numbering started again (a server that lost its playlist: we are ahead of it)."""
        behind = pl.segments and self.next_sn is not None and self.next_sn < pl.segments[0].sn
        ahead = self.next_sn is not None and self.next_sn > pl.last_sn + 1
        if self.next_sn is None or behind or ahead:
            start = pl.live_start()
            if start is None:
                return  # not three target durations yet: wait
            if self.next_sn is not None:
                self.resyncs += 1
                self.skipped += max(0, start.sn - self.next_sn)
            self.next_sn = start.sn

    def _next_segment(self) -> SegmentRecord | None:
        pl = self.playlist
        if pl is None or self.next_sn is None or self.next_sn > pl.last_sn:
            return None
        return self.listed.get(self.next_sn)

    def _fetch(self, rec: SegmentRecord) -> None:
        f = self.http.get(rec.url, self.deadline)
        rec.fetch = f
        self.records.append(rec)
        assert self.next_sn is not None
        if f.complete:
            rec.content = mpegts.parse_ts(f.body)
            for e in rec.content.errors:
                self._error(f"segment {rec.sn}: {e}")
            f.body = b""  # only its size is kept
        elif time.monotonic() >= self.deadline:
            return  # the watch ended mid-segment: it never arrived
        else:
            self.skipped += 1
            self._error(f"segment {rec.sn}: {f.error or f'HTTP {f.status}'}")
        self.next_sn += 1

    def _error(self, text: str) -> None:
        if len(self.errors) < 50:
            self.errors.append(text)

    # -- the summary -----------------------------------------------------------------------
    def recording(self) -> viewing.Recording:
        """The frames that arrived, as the RTMP viewer's model takes them: each at its
        segment's completion, with its PTS on the publisher's clock."""
        rec = viewing.Recording(self.t0)
        off = self.args.pts_offset
        for r in self.records:
            f, c = r.fetch, r.content
            if f is None or c is None or not f.complete or f.done_mono is None:
                continue
            t, wall_ns = f.done_mono - self.t0, int(f.done_unix * 1e9) if f.done_unix else 0
            for fr in c.frames:
                rec.frames.append(viewing.VideoFrame(t, wall_ns, fr.pts - off, fr.pts - off,
                                                      fr.key, fr.size))
            rec.audio_packets += c.audio_packets
            rec.audio_bytes += c.audio_bytes
            if c.frames or c.audio_packets:
                rec.first_t = t if rec.first_t is None else rec.first_t
                rec.last_t = t
        return rec

    def fps(self, rec: viewing.Recording) -> tuple[float, str]:
        if self.args.fps:
            return self.args.fps, "--fps"
        steps = [b.pts - a.pts for a, b in zip(rec.frames, rec.frames[1:], strict=False)
                 if 0 < b.pts - a.pts < 1.0]
        if not steps:
            return FALLBACK_FPS, "fallback"
        return round(1 / median(steps), 3), "pts"

    def summary(self) -> dict[str, Any]:
        a = self.args
        join = self.join_ns / 1e9
        stop = self.stop_t if self.stop_t is not None else time.monotonic() - self.t0
        rec = self.recording()
        fps, fps_source = self.fps(rec)
        watch = viewing.Watch(join, stop, a.duration, self.end_reason)
        s = viewing.summarize(rec, stream_id=a.stream_id, fps=fps, startup_ms=a.startup_ms,
                               rebuffer_ms=a.rebuffer_ms, watch=watch,
                               publish_epoch=a.publish_epoch)
        done = [r for r in self.records if r.fetch is not None and r.fetch.complete]
        ts_bytes = sum(r.fetch.nbytes for r in done if r.fetch is not None)
        fetch_s = [r.fetch.done_unix - r.fetch.request_unix for r in done
                   if r.fetch is not None and r.fetch.done_unix is not None]
        span = (rec.last_t - rec.first_t) + 1 / fps if rec.first_t is not None else 0.0
        for e in s["stall_events"]:
            e["end_s"] = e["start_s"] + e["duration_s"]
        s.update({
            "protocol": "hls", "fps_source": fps_source, "pts_offset_s": a.pts_offset,
            "start_rule": f"RFC 8216 6.3.3: {LIVE_SYNC_COUNT} target durations from the end",
            "target_duration_s": sorted(self.target_durations),
            "segments_fetched": len(done), "segments_skipped": self.skipped,
            "live_resyncs": self.resyncs,
            "playlist_reloads": self.reloads, "playlist_failures": self.reload_failures,
            "playlist_bytes": self.playlist_bytes, "http_connects": self.http.connects,
            "bytes": ts_bytes, "bytes_received": ts_bytes + self.playlist_bytes,
            "throughput_bps": ts_bytes * 8 / span if span > 0 else 0.0,
            "segment_fetch_ms": {"p50": _ms(percentile(fetch_s, 50)),
                                 "p99": _ms(percentile(fetch_s, 99)),
                                 "max": _ms(max(fetch_s, default=None))},
            "segments": [r.to_dict(join) for r in self.records],
        })
        cpu = os.times()
        cpu_s = cpu.user + cpu.system
        out: dict[str, Any] = {
            "schema": playout.SUMMARY_SCHEMA, "tool": "play", "agent": "hlsview",
            "media": "real", "protocol": "hls", "proto": "tcp", "url": a.url,
            "startup_ms": a.startup_ms, "rebuffer_ms": a.rebuffer_ms,
            "started_unix": join, "publish_epoch": a.publish_epoch,
            "stopped_by": self.stopped, "errors": self.errors,
            "cpu_s": cpu_s, "cpu_pct": 100 * cpu_s / stop if stop > 0 else None,
            "live_writes": self.live_file.writes,
            "streams": [s],
        }
        out.update(playout.stream_totals(out))
        return out


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1e3


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab.agents.hlsview", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_viewer_arguments(p, url_help="http://server[:port]/path/stream.m3u8",
                         ready_help="written (this viewer's PID) once it has started")
    p.add_argument("--fps", type=positive_float, default=None,
                   help="the stream's frame rate (default: measured from the video PTS)")
    p.add_argument("--startup-ms", type=float, default=DEFAULT_STARTUP_MS,
                   help="media buffered before playback starts (default "
                        f"{DEFAULT_STARTUP_MS:g}: {viewing.BUFFER_RULE_SOURCE})")
    p.add_argument("--rebuffer-ms", type=float, default=DEFAULT_REBUFFER_MS,
                   help="media buffered again before playback resumes after a stall "
                        f"(default {DEFAULT_REBUFFER_MS:g}: {viewing.BUFFER_RULE_SOURCE})")
    p.add_argument("--pts-offset", type=float, default=NGINX_MUXDELAY_S,
                   help="seconds the server added to the publisher's timestamps (default "
                        f"{NGINX_MUXDELAY_S:g}: nginx-rtmp's hls_muxdelay)")
    return p


def main(argv: list[str] | None = None) -> int:
    catch_signals()
    args = build_parser().parse_args(argv)
    viewer = Viewer(args)
    viewer.run()
    viewer.write_live(time.monotonic(), final=True)
    write_json(viewer.summary(), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
