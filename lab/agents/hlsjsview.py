"""hls.js in headless Chromium as a viewer, run inside a host's namespace: a real browser's
player on the same live HLS stream the lab's own viewers watch, to check their stall counts.

``python -m lab.agents.hlsjsview --url http://cdn:8080/hls/big1.m3u8 --duration 30 --out v.json``

opens ``http://cdn:8080/player/index.html#src=/hls/big1.m3u8`` (``lab/agents/hlsjs/index.html``
and hls.js's ``hls.min.js``, served by the CDN's nginx under ``/player/``, same origin as the
playlist) in ``chromium-headless-shell``. The page plays the stream muted with hls.js's
defaults (and ``initialLiveManifestSize`` 3, see the page) and prints one ``EVT {json}``
console line per ``waiting``, ``playing``, ``stalled``, hls.js error, buffered fragment, and a
sample every 500 ms; with ``--enable-logging=stderr`` Chromium writes those lines to its
stderr, which this agent reads as they come. No debugging port is opened: Chromium listens
on nothing.

The summary (``{"streams": [...]}``, the keys of the RTMP and HLS viewers where they mean the
same) is what the browser did:

* ``startup_delay_s``: from this agent's start (the join) to the first ``playing``;
* a **stall** is a ``waiting`` after the first ``playing`` (``waiting`` before it is start-up),
  ending at the next ``playing``; one still open when the watch ends lasts until then.
  ``rebuffer_ratio`` is CTA-2066's, stall time over stall plus play time. The browser resumes
  as soon as it can play again (readyState ``HAVE_FUTURE_DATA``; hls.js appends whole
  segments), not after 2 s of buffer as the lab's model does: two stalls less than about 2 s
  apart are one for the model and two here;
* ``live_latency_s`` (with ``--publish-epoch``): the median over the samples while playing
  of wall time minus the publisher's send time of the frame on screen, which is hls.js's
  ``initPTS`` plus ``currentTime`` less ``--pts-offset`` (nginx-rtmp's ``hls_muxdelay``);
  ``hlsjs_latency_s`` is hls.js's own estimate, the distance behind the playlist's end.

Chromium forks a zygote, renderers, a GPU and a network process. The browser binary is
started directly (not Debian's ``sh`` wrapper, which would stand between) in a session and
process group of its own (``start_new_session``), and this agent is their child subreaper
(``PR_SET_CHILD_SUBREAPER``), so that the orphans come to it and not to PID 1. On every way
out (the watch over, SIGTERM/SIGINT, Chromium exiting, an error) the whole group is
SIGKILLed by its id, the browser and every orphan reaped, and any process still in the
session killed by PID, until none is left. If this agent is SIGKILLed itself, the browser
dies with it (``PR_SET_PDEATHSIG``) and its children with the browser (they exit when its
IPC closes: checked, none survives). Its profile (``--user-data-dir``), HOME and caches are
in a directory of its own beside ``--out``, removed afterwards (except after a SIGKILL).

With ``--live-file PATH`` the agent also rewrites ``PATH`` about every 0.5 s while it
watches with the browser's state so far (the live file of :mod:`lab.agents.rtmpview`: times in
``time.monotonic()`` seconds), its stalls counted by the rule above from the events so far,
and once more when it stops.

This runs inside hosts: standard library and ``lab.agents`` only.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
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
    ignore_signals,
    live_state,
    proc_stat,
    write_json,
)

CHROMIUM = "chromium-headless-shell"
#: The browser itself: Debian's /usr/bin/chromium-headless-shell is a ``sh -e`` script that
#: runs it as its child (not ``exec``), so with the script the PID we hold, and the one that
#: PR_SET_PDEATHSIG kills, would be the shell's, not the browser's.
CHROMIUM_BINARIES = ("/usr/lib/chromium/chromium-headless-shell",)
#: Where the CDN serves the page (``location /player/``).
PAGE_PATH = "/player/index.html"
#: nginx-rtmp's ``hls_muxdelay`` default: TS timestamps are the RTMP ones plus this (s).
NGINX_MUXDELAY_S = 0.7
#: The page's sample period (ms).
SAMPLE_MS = 500
#: The console lines we want, and Chromium's own lines worth keeping (bytes kept).
EVT_MARK = '"EVT '
STDERR_KEEP = 4000
#: Chromium's own log noise in a namespace without D-Bus, audio or a GPU.
_NOISE = re.compile(r"dbus|bluez|Floss|vaapi|drmGetDevices|InitializeSandbox|ALSA|"
                    r"PulseAudio|gpu_init|viz_main|ozone|fontconfig")
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
#: How long the group may take to be gone after its SIGKILL (s).
REAP_TIMEOUT_S = 5.0


def find_chromium() -> str:
    """The headless shell's binary: the real one where Debian puts it, else PATH's."""
    for path in CHROMIUM_BINARIES:
        if os.access(path, os.X_OK):
            return path
    return shutil.which(CHROMIUM) or CHROMIUM


def chromium_argv(binary: str, profile: Path, page_url: str) -> list[str]:
    """The browser's command: headless, no sandbox (it runs as root in a namespace), no GPU,
    autoplay without a gesture, console to stderr; no background traffic of its own."""
    return [binary, "--headless", "--no-sandbox", "--disable-gpu",
            "--autoplay-policy=no-user-gesture-required", f"--user-data-dir={profile}",
            "--enable-logging=stderr", "--v=0", "--mute-audio", "--no-first-run",
            "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-breakpad", page_url]


def page_url(playlist_url: str, page_path: str = PAGE_PATH, sample_ms: int = SAMPLE_MS) -> str:
    """The player page on the playlist's server, told which playlist to play."""
    parts = urllib.parse.urlsplit(playlist_url)
    src = parts.path + (f"?{parts.query}" if parts.query else "")
    frag = urllib.parse.urlencode({"src": src, "sample_ms": sample_ms})
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, page_path, "", frag))


def parse_evt(line: str) -> dict[str, Any] | None:
    """The JSON object of one ``"EVT {...}", source: ...`` console line, or None."""
    i = line.find(EVT_MARK)
    if i < 0:
        return None
    try:
        obj, _ = json.JSONDecoder().raw_decode(line, i + len(EVT_MARK))
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and "e" in obj and "t" in obj else None


# --------------------------------------------------------------------------------------------
# Processes: Chromium's session
# --------------------------------------------------------------------------------------------


def session_pids(sid: int) -> list[int]:
    """Every live (not zombie) process in session ``sid``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st is not None and int(st[3]) == sid and st[0] != "Z":
                out.append(int(entry))
    return out


def session_cpu_s(sid: int) -> float:
    """CPU seconds (user + system) of the session's processes, with their reaped children."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st is not None and int(st[3]) == sid:
                total += int(st[11]) + int(st[12]) + int(st[13]) + int(st[14])
    return total / tick


def _prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def become_subreaper() -> bool:
    """Make this process the one Chromium's orphans are re-parented to (instead of PID 1),
    so that it can reap every one of them (``PR_SET_CHILD_SUBREAPER``)."""
    prctl = _prctl()
    return prctl is not None and prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _child_setup(mask: set[signal.Signals], parent: int) -> Callable[[], None]:
    """Between fork and exec: the signal mask from before the fork, and death with the
    parent (``PR_SET_PDEATHSIG``), checked against a parent that died before it was set."""
    prctl = _prctl()

    def setup() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent:
                os._exit(1)
    return setup


# --------------------------------------------------------------------------------------------
# From events to what the viewer saw
# --------------------------------------------------------------------------------------------


def summarize(events: list[dict[str, Any]], *, join_unix: float, stop_s: float,
              stream_id: int, publish_epoch: float | None = None,
              pts_offset: float = NGINX_MUXDELAY_S) -> dict[str, Any]:
    """The per-stream entry from the page's events (``t`` in epoch ms), times in s since
    ``join_unix``; ``stop_s`` is when the watch ended."""

    def rel(ev: dict[str, Any]) -> float:
        return float(ev["t"]) / 1e3 - join_unix

    page = next((e for e in events if e["e"] == "page"), {})
    first_play = next((rel(e) for e in events if e["e"] == "playing"), None)
    stalls: list[dict[str, Any]] = []
    waiting_at: float | None = None
    if first_play is not None:
        for e in events:
            t = rel(e)
            if t <= first_play:
                continue
            if e["e"] == "waiting" and waiting_at is None:
                waiting_at = t
            elif e["e"] == "playing" and waiting_at is not None:
                stalls.append({"start_s": waiting_at, "end_s": t, "duration_s": t - waiting_at,
                               "open": False})
                waiting_at = None
        if waiting_at is not None and waiting_at < stop_s:
            stalls.append({"start_s": waiting_at, "end_s": stop_s,
                           "duration_s": stop_s - waiting_at, "open": True})
    stall_s = sum(s["duration_s"] for s in stalls)
    play_s = max(0.0, stop_s - first_play - stall_s) if first_play is not None else 0.0
    total = stall_s + play_s
    samples = [e for e in events if e["e"] == "sample"]
    hls_lat = [e["lat"] for e in samples if isinstance(e.get("lat"), (int, float))
               and first_play is not None and rel(e) > first_play]
    errors = [{"t_s": round(rel(e), 3), "type": e.get("type"), "details": e.get("details"),
               "fatal": e.get("fatal")} for e in events if e["e"] == "hlserror"]
    last = samples[-1] if samples else {}
    ua = str(page.get("ua", ""))
    chrome = re.search(r"HeadlessChrome/([\d.]+)", ua)
    return {
        "stream_id": stream_id, "media": "real", "protocol": "hls", "proto": "tcp",
        "player": f"hls.js {page.get('version', '?')} in Chromium "
                  f"{chrome.group(1) if chrome else '?'}",
        "join_unix": join_unix, "page_ok": bool(page.get("ok")),
        "started": first_play is not None, "startup_delay_s": first_play,
        "stalls": len(stalls), "stall_s": stall_s,
        "stall_count": len(stalls), "stall_total_s": stall_s,
        "stall_longest_s": max((s["duration_s"] for s in stalls), default=0.0),
        "stall_events": stalls,
        "play_s": play_s, "watch_s": stop_s,
        "starved_s": stop_s if first_play is None else 0.0,
        "rebuffer_ratio": stall_s / total if total > 0 else None,
        "waiting_events": sum(e["e"] == "waiting" for e in events),
        "buffer_stalled_errors": sum(e.get("details") == "bufferStalledError"
                                     for e in events if e["e"] == "hlserror"),
        "fragments_buffered": sum(e["e"] == "frag" for e in events),
        "frames_decoded": last.get("frames"), "frames_dropped": last.get("dropped"),
        "live_latency_s": _live_latency(events, rel, first_play, stalls, publish_epoch,
                                        pts_offset),
        "hlsjs_latency_s": median(hls_lat) if hls_lat else None,
        "pts_offset_s": pts_offset,
        "hls_errors": errors,
        "events": [{**e, "t_s": round(rel(e), 4)} for e in events],
    }


def _live_latency(events: list[dict[str, Any]], rel: Callable[[dict[str, Any]], float],
                  first_play: float | None, stalls: list[dict[str, Any]],
                  epoch: float | None, pts_offset: float) -> float | None:
    """Median over samples while playing of wall time minus the publisher's send time of the
    frame shown: ``epoch + initPTS/timescale + currentTime - pts_offset``."""
    if epoch is None or first_play is None:
        return None
    init: float | None = None
    lat = []
    for e in events:
        if e["e"] == "initpts" and e.get("timescale"):
            init = float(e["initpts"]) / float(e["timescale"])
        elif e["e"] == "sample" and init is not None:
            t = rel(e)
            if t <= first_play or any(s["start_s"] <= t < s["end_s"] for s in stalls):
                continue
            lat.append(float(e["t"]) / 1e3 - (epoch + init + float(e["ct"]) - pts_offset))
    return median(lat) if lat else None


# --------------------------------------------------------------------------------------------
# The viewer
# --------------------------------------------------------------------------------------------


class Viewer:
    """Starts Chromium on the page, reads its console until the watch is over, then kills
    its whole session."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.join_ns = time.time_ns()
        self.t0 = time.monotonic()
        self.url = page_url(args.url, args.page_path)
        self.binary = args.chromium or find_chromium()
        base = Path(args.out).resolve().parent if args.out else None
        self.profile = Path(tempfile.mkdtemp(prefix=f"chromium-{args.stream_id}-", dir=base))
        self.argv = chromium_argv(self.binary, self.profile, self.url)
        self.proc: subprocess.Popen[bytes] | None = None
        self.events: list[dict[str, Any]] = []
        self.stderr_tail = ""
        self._rest = b""
        self.end_reason = "duration"
        self.stopped: str | None = None
        self.errors: list[str] = []
        self.stop_t: float | None = None
        self.cpu_s: float | None = None
        self.started_t: float | None = None
        self.rc: int | None = None
        self.max_procs = 0
        self.left_behind: list[int] = []
        self.subreaper = False
        self.live_file = LiveFile(args.live_file)

    def run(self) -> None:
        try:
            self._start()
            self._watch()
        except StopRequestedError as exc:
            self.stopped = self.end_reason = str(exc)
        except OSError as exc:  # no Chromium, or the ready file could not be written
            self.end_reason = "error"
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            ignore_signals()
            self.stop_t = time.monotonic() - self.t0
            self.stop()
            if not self.args.keep_profile:
                shutil.rmtree(self.profile, ignore_errors=True)

    def _start(self) -> None:
        self.subreaper = become_subreaper()
        env = dict(os.environ, HOME=str(self.profile), TMPDIR=str(self.profile),
                   XDG_CONFIG_HOME=str(self.profile / "config"),
                   XDG_CACHE_HOME=str(self.profile / "cache"))
        old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, env=env, start_new_session=True,
                preexec_fn=_child_setup(old, os.getpid()))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        self.started_t = time.monotonic() - self.t0
        if self.args.ready_file:
            Path(self.args.ready_file).write_text(f"{self.proc.pid}\n")

    def _watch(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        deadline = self.t0 + self.args.duration
        fd = self.proc.stderr.fileno()
        next_count = 0.0
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                now = time.monotonic()
                if now >= deadline:
                    return
                if now >= next_count:  # how many processes Chromium runs, once a second
                    self.max_procs = max(self.max_procs, len(session_pids(self.proc.pid)))
                    next_count = now + 1.0
                if self.live_file.due(now):
                    self.write_live(now)
                if not sel.select(self.live_file.wait_s(now, min(1.0, deadline - now))):
                    continue
                data = os.read(fd, 1 << 16)
                if not data:
                    self.end_reason = "exited"
                    return
                self._feed(data)

    def _feed(self, data: bytes) -> None:
        *lines, self._rest = (self._rest + data).split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace")
            ev = parse_evt(line)
            if ev is not None:
                self.events.append(ev)
            elif line.strip() and not _NOISE.search(line):
                self.stderr_tail = (self.stderr_tail + line + "\n")[-STDERR_KEEP:]

    def stop(self) -> None:
        """SIGKILL Chromium's process group (its id is the browser's PID: it was made a
        session leader), reap the browser, wait until no process of its session is left."""
        proc = self.proc
        if proc is None or self.rc is not None:
            return
        sid = proc.pid
        self.cpu_s = session_cpu_s(sid)  # before the kill: /proc forgets the reaped
        self.max_procs = max(self.max_procs, len(session_pids(sid)))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sid, signal.SIGKILL)
        proc.wait()
        self.rc = proc.returncode
        assert proc.stderr is not None
        with contextlib.suppress(OSError):
            os.set_blocking(proc.stderr.fileno(), False)
            self._feed((proc.stderr.read() or b"") + b"\n")
        proc.stderr.close()
        deadline = time.monotonic() + REAP_TIMEOUT_S
        while time.monotonic() < deadline:
            for pid in session_pids(sid):  # one that left the group but not the session
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if not self._reap() and not session_pids(sid):
                break
            time.sleep(0.02)
        self.left_behind = session_pids(sid)
        if self.left_behind:
            self.errors.append(f"Chromium processes still there: {self.left_behind}")

    def _reap(self) -> bool:
        """Reap the orphans re-parented to us (we are their subreaper); True while some
        child is still there. Chromium is this agent's only child."""
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True

    def write_live(self, now: float, final: bool = False) -> None:
        """The live file (``--live-file``): the browser's stalls so far, by the rule the
        summary counts them with (:func:`summarize` over the events until ``now``)."""
        if self.live_file.path is None:
            return
        stop = (self.stop_t if final and self.stop_t is not None else now - self.t0)
        s = summarize(self.events, join_unix=self.join_ns / 1e9, stop_s=stop,
                      stream_id=self.args.stream_id)
        stalls = [(e["start_s"], None if e["open"] and not final else e["end_s"])
                  for e in s["stall_events"]]
        self.live_file.write(live_state(agent="hlsjsview", stream_id=self.args.stream_id,
                                        t0=self.t0, now=self.t0 + stop,
                                        startup_delay_s=s["startup_delay_s"], stalls=stalls,
                                        final=final), now)

    def summary(self) -> dict[str, Any]:
        a = self.args
        join = self.join_ns / 1e9
        stop = self.stop_t if self.stop_t is not None else time.monotonic() - self.t0
        stream = summarize(self.events, join_unix=join, stop_s=stop, stream_id=a.stream_id,
                           publish_epoch=a.publish_epoch, pts_offset=a.pts_offset)
        stream["end_reason"] = self.end_reason
        ran = stop - self.started_t if self.started_t is not None else None
        errors = list(self.errors)
        if self.end_reason == "exited" or not stream["page_ok"]:
            errors.append(self.stderr_tail.strip())
        return {
            "schema": playout.SUMMARY_SCHEMA, "tool": "play", "agent": "hlsjsview",
            "media": "real", "protocol": "hls", "proto": "tcp", "url": a.url,
            "page_url": self.url, "player": stream["player"],
            "started_unix": join, "publish_epoch": a.publish_epoch,
            "stopped_by": self.stopped, "errors": [e for e in errors if e],
            "chromium": {"argv": self.argv, "pid": self.proc.pid if self.proc else None,
                         "returncode": self.rc, "started_s": self.started_t,
                         "cpu_s": self.cpu_s,
                         "cpu_pct": 100 * self.cpu_s / ran if self.cpu_s is not None and ran
                         else None,
                         "processes_max": self.max_procs, "left_behind": self.left_behind},
            "stream_count": 1, "stalls": stream["stalls"], "stall_s": stream["stall_s"],
            "streams": [stream],
        }


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab.agents.hlsjsview", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_viewer_arguments(p, url_help="the playlist: http://server[:port]/hls/stream.m3u8",
                         ready_help="written (Chromium's PID) once it has started",
                         epoch_help="gives live latency")
    p.add_argument("--page-path", default=PAGE_PATH,
                   help=f"where that server serves the player page (default {PAGE_PATH})")
    p.add_argument("--pts-offset", type=float, default=NGINX_MUXDELAY_S,
                   help="seconds the server added to the publisher's timestamps (default "
                        f"{NGINX_MUXDELAY_S:g}: nginx-rtmp's hls_muxdelay)")
    p.add_argument("--chromium", help=f"the browser (default: {CHROMIUM} on PATH)")
    p.add_argument("--keep-profile", action="store_true",
                   help="keep Chromium's profile directory afterwards")
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
