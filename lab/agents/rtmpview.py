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
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
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
    pdeathsig_setter,
    positive_float,
    write_json,
)
from lab.agents.viewing import (
    BUFFER_RULE_SOURCE,
    DEFAULT_REBUFFER_MS,
    DEFAULT_STARTUP_MS,
    Recording,
    Watch,
    live,
    live_watch,
    summarize,
)
from lab.agents.workerbase import cpu_s

#: Limits of ffprobe's stream analysis: it normally ends long before, at the first video
#: packet (at most a GOP after joining); these only bound a stream that has no video.
PROBESIZE_BYTES = 10_000_000
ANALYZE_US = 10_000_000
#: Connecting, and waiting for the stream to start, may take this long (microseconds).
RW_TIMEOUT_US = 5_000_000
#: How much of ffprobe's stderr is kept for the summary.
STDERR_KEEP = 4000


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
# The viewer: ffprobe as a child, read until the time is up
# --------------------------------------------------------------------------------------------


def _child_setup(mask: set[signal.Signals], parent: int) -> Callable[[], None]:
    """What ffprobe runs between fork and exec: the signal mask the parent had before it
    blocked SIGTERM/SIGINT around the fork (a mask survives exec), and death with its
    parent, so that not even a SIGKILLed viewer leaves an ffprobe behind."""
    die_with = pdeathsig_setter()

    def setup() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        die_with(parent)
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
        watch, now = live_watch(self.join_ns / 1e9, self.t0, now, a.duration, self.stop_t,
                                self.end_reason, final)
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
