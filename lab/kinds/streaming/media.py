"""Real media for the streaming kind: an H.264 + AAC clip encoded once per machine, nginx with
the RTMP module as the ingest media servers, the origin and the CDN nodes, and ffmpeg as the
pushers (the anchors', and the origin streams' into their media servers).

Why these parts: they are what a live platform runs (RTMP ingest into nginx-rtmp, relays by
stream name, HLS cut at keyframes), and each brings behaviour the lab's own sender does not
have - GOP-sized bursts, a server that queues and drops frames for a slow subscriber
(nginx-rtmp drops inter frames once 128 messages wait), a player that starts at a keyframe.

Every server listens only on its host's fabric address; its configuration, PID file, logs and
HLS segments live in the run's directory, and its PID is in the run record (one process:
``master_process off``, so a ``kill -9`` leaves no worker behind).

Neither ffmpeg nor nginx's relays can be told a source port. The lab starts a phase's pushers
one after another with the sending namespace's ephemeral range narrowed to the stream's
planned port, so every stream's connection has the 5-tuple its counters, hash seeds and pins
were set for (``lab.kinds.streaming.programs``).
"""

from __future__ import annotations

import hashlib
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.machine import programs
from lab.model.errors import MachineError, ScenarioError

RTMP_PORT = 1935
HLS_PORT = 8080
RTMP_MODULE = Path("/usr/lib/nginx/modules/ngx_rtmp_module.so")
#: hls.js (``lab/setup.sh`` installs it from npm) and its page, which a CDN node serves at
#: ``/player/``, same origin as its HLS; a browser viewer plays a stream with them.
HLSJS = Path("/var/cache/fabriclab/hlsjs/node_modules/hls.js/dist/hls.min.js")
PLAYER_DIR = Path(__file__).resolve().parents[2] / "agents" / "hlsjs"
CHROMIUM = Path("/usr/lib/chromium/chromium-headless-shell")
#: How far behind live an HLS viewer plays: hls.js and RFC 8216 start three target
#: durations (1 s fragments) from the playlist's end, which exists once the first fragment
#: is cut. HLS viewers watch this much longer than a phase, to see all of its media.
HLS_LAG_S = 4.0
#: What real media needs on this machine: Debian package -> the file it installs.
PACKAGES = {"ffmpeg": Path("/usr/bin/ffmpeg"), "nginx": Path("/usr/sbin/nginx"),
            "libnginx-mod-rtmp": RTMP_MODULE}
MEDIA_CHOICES = ("real", "synthetic")
BROWSER_CHOICES = ("auto", "always", "never")
#: Encoded clips, one per (bitrate, frame rate, GOP, ffmpeg build): kept across runs.
CACHE_DIR = Path("/var/cache/fabriclab/media")
#: Audio in every clip; the video gets the rest of the stream's bitrate.
AUDIO_KBPS = 64
#: The clip's length: a whole number of GOPs and of AAC frames (48 kHz, 1024 samples: 375
#: frames are exactly 8 s), so ``-stream_loop`` neither breaks the GOP cadence nor drifts
#: the audio against the video.
CLIP_S = 8
CLIP_SIZE = "640x360"
#: How long a server may take to listen, and a pusher's connection to appear.
START_TIMEOUT_S = 10.0


def missing_packages() -> list[str]:
    """The Debian packages real media needs that this machine lacks."""
    return [pkg for pkg, path in PACKAGES.items() if not path.exists()]


def browser_ready() -> bool:
    """Whether the hls.js viewer can run here: the headless browser and hls.js present."""
    return CHROMIUM.exists() and HLSJS.exists()


def browser(params: dict[str, Any]) -> bool:
    """``streams.browser``: whether the first big stream also gets the hls.js viewer.
    ``auto`` (the default) where Chromium and hls.js are installed; ``always`` requires them
    (one error naming what to install, before anything starts); ``never``: Chromium takes
    most of a core, which a TCG guest's real media cannot spare beside its players."""
    asked = params["streams"].get("browser", "auto")
    if asked == "never":
        return False
    if asked == "always" and resolve(params) != "real":
        raise ScenarioError("streams.browser", "the browser viewer plays real media's HLS, "
                            "and this run streams synthetic media (streams.media: real)")
    if asked == "always" and not browser_ready():
        raise ScenarioError("streams.browser", "the browser viewer needs Chromium "
                            f"({CHROMIUM}) and hls.js ({HLSJS}): make setup installs both")
    return browser_ready()


def resolve(params: dict[str, Any]) -> str:
    """``streams.media`` as the run will use it: as given, else real where its packages are
    present, the streams are TCP (RTMP is) and the run has its full rates. Asking for real
    media without the packages is one error naming them.

    Why not under a reduced rate profile (``rate_scale`` < 1, a TCG guest's): measured in
    the TCG guest at 1/8 rates, real media's incident left 0 % CPU idle (fidelity invalid),
    its uplink dropped 807 packets and no viewer stalled - the emulator, not the network,
    set the pace. The lab's own sender stays valid there.
    """
    asked = params["streams"].get("media")
    if asked is None:
        real = not missing_packages() and params["streams"]["proto"] == "tcp" \
            and float(params.get("rate_scale", 1.0)) == 1.0
        return "real" if real else "synthetic"
    if asked not in MEDIA_CHOICES:
        raise ScenarioError("streams.media", f"unknown value {asked!r} (known: "
                            f"{', '.join(MEDIA_CHOICES)})")
    if asked == "real" and (lack := missing_packages()):
        raise ScenarioError("streams.media", f"real media needs the Debian package(s) "
                            f"{', '.join(lack)} (apt-get install {' '.join(lack)}), or "
                            "streams.media: synthetic")
    return str(asked)


# -- the clip ---------------------------------------------------------------------------------
def ffmpeg_version() -> str:
    out = subprocess.run(["ffmpeg", "-hide_banner", "-version"], capture_output=True,
                         text=True, check=False).stdout
    return out.splitlines()[0] if out else "unknown"


def clip_args(rate_mbps: float, fps: float, gop_s: float, out: Path) -> list[str]:
    """ffmpeg's command for one clip: constant bitrate (x264's HRD filler, a VBV of one
    second so the keyframes burst at GOP scale), a keyframe every ``gop_s`` exactly (no
    scene-cut keyframes), no B-frames (each RTMP message is then one frame in presentation
    order, which the players' timing assumes)."""
    video_k = max(50, round(rate_mbps * 1000) - AUDIO_KBPS)
    gop = max(1, round(fps * gop_s))
    return ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y",
            "-f", "lavfi", "-i", f"testsrc2=size={CLIP_SIZE}:rate={fps:g}",
            "-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000", "-t", str(CLIP_S),
            "-c:v", "libx264", "-preset", "veryfast", "-profile:v", "main",
            "-pix_fmt", "yuv420p", "-bf", "0",
            "-b:v", f"{video_k}k", "-minrate", f"{video_k}k", "-maxrate", f"{video_k}k",
            "-bufsize", f"{video_k}k", "-g", str(gop), "-keyint_min", str(gop),
            "-sc_threshold", "0", "-x264-params", "nal-hrd=cbr:force-cfr=1",
            "-c:a", "aac", "-b:a", f"{AUDIO_KBPS}k", "-ac", "2", "-ar", "48000",
            "-f", "flv", str(out)]


def clip(rate_mbps: float, fps: float, gop_s: float, cache: Path = CACHE_DIR) -> Path:
    """The cached clip for these parameters, encoded on first use (a second or two)."""
    key = hashlib.sha256(f"{rate_mbps:g}|{fps:g}|{gop_s:g}|{CLIP_S}|{CLIP_SIZE}|"
                         f"{AUDIO_KBPS}|{ffmpeg_version()}".encode()).hexdigest()[:16]
    path = cache / f"clip-{rate_mbps:g}M-{fps:g}fps-gop{gop_s:g}-{key}.flv"
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    done = subprocess.run(clip_args(rate_mbps, fps, gop_s, tmp), capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise MachineError("streams.media", f"ffmpeg could not encode the clip: "
                           f"{done.stderr.strip()[-300:]}")
    tmp.rename(path)
    return path


# -- the servers ------------------------------------------------------------------------------
@dataclass
class Server:
    """One nginx-rtmp server: its host, address, role and run directory."""

    host: str
    ip: str
    role: str                     # ingest | origin | cdn
    dir: Path
    pushes: dict[str, str]        # stream name -> the address it is pushed on to
    proc: Any = None
    #: Its ports: the lab's hosts each have their own address; a test on loopback does not.
    rtmp_port: int = RTMP_PORT
    http_port: int = HLS_PORT

    def conf(self) -> str:
        """nginx.conf: one process, everything in the run directory, listening only on the
        host's fabric address; a CDN node also cuts HLS (1 s fragments, at keyframes) and
        serves it over HTTP."""
        d = self.dir
        push = "".join(f"      push rtmp://{dst}:{RTMP_PORT}/live name={name};\n"
                       for name, dst in sorted(self.pushes.items()))
        hls = ""
        http = ""
        if self.role == "cdn":
            hls = (f"      hls on;\n      hls_path {d}/hls;\n      hls_fragment 1s;\n"
                   "      hls_playlist_length 6s;\n")
            http = (
                "http {\n"
                f"  access_log {d}/access.log;\n"
                f"  client_body_temp_path {d}/tmp/body;\n  proxy_temp_path {d}/tmp/proxy;\n"
                f"  fastcgi_temp_path {d}/tmp/fcgi;\n  uwsgi_temp_path {d}/tmp/uwsgi;\n"
                f"  scgi_temp_path {d}/tmp/scgi;\n"
                "  types { application/vnd.apple.mpegurl m3u8; video/mp2t ts; "
                "text/html html; application/javascript js; }\n"
                f"  server {{\n    listen {self.ip}:{self.http_port};\n"
                f"    location /hls/ {{ alias {d}/hls/; add_header Cache-Control no-cache; }}\n"
                f"    location = /player/hls.min.js {{ alias {HLSJS}; }}\n"
                f"    location /player/ {{ alias {PLAYER_DIR}/; }}\n"
                "  }\n}\n")
        return (f"load_module {RTMP_MODULE};\n"
                "master_process off;\nworker_processes 1;\n"
                f"pid {d}/nginx.pid;\nerror_log {d}/error.log info;\n"
                "events { worker_connections 256; }\n"
                "rtmp {\n  server {\n"
                f"    listen {self.ip}:{self.rtmp_port};\n    chunk_size 4096;\n"
                "    application live {\n      live on;\n      record off;\n"
                # A subscriber (a relay, a viewer, the HLS cutter) starts at a keyframe with
                # its audio: without it the first HLS fragment is audio only, and a browser
                # player then has no video track to append the rest to.
                "      wait_video on;\n"
                f"{push}{hls}    }}\n  }}\n}}\n{http}")

    def argv(self) -> list[str]:
        return ["nginx", "-p", f"{self.dir}/", "-c", str(self.dir / "nginx.conf"),
                "-e", str(self.dir / "error.log"), "-g", "daemon off;"]

    def tail(self, n: int = 5) -> str:
        try:
            lines = (self.dir / "error.log").read_text().strip().splitlines()
        except OSError:
            lines = []
        return " | ".join(lines[-n:]) or "(no log)"


def listening(fabric: Any, host: str, ip: str, port: int) -> bool:
    out = fabric.host(host).cmd(f"ss -ltnH 'src {ip}:{port}'")
    return f"{ip}:{port}" in out


def start_servers(fabric: Any, servers: list[Server]) -> None:
    """Start every server and wait until each listens; one that does not is one error with
    its log's last lines (the others are stopped by the run's clean-up, by PID)."""
    for s in servers:
        (s.dir / "tmp").mkdir(parents=True, exist_ok=True)
        (s.dir / "hls").mkdir(exist_ok=True)
        (s.dir / "nginx.conf").write_text(s.conf())
        s.proc = programs.spawn(fabric, s.host, s.argv(), s.dir / "nginx.out",
                                f"nginx-rtmp {s.role} {s.host}", "media")
    deadline = time.monotonic() + START_TIMEOUT_S
    for s in servers:
        while not listening(fabric, s.host, s.ip, s.rtmp_port):
            if s.proc.poll() is not None or time.monotonic() > deadline:
                raise MachineError("streams.media", f"nginx-rtmp on {s.host} did not start "
                                   f"({'exited' if s.proc.poll() is not None else 'timed out'}):"
                                   f" {s.tail()}")
            time.sleep(0.05)


def stop(procs: list[Any], grace_s: float = 3.0) -> None:
    """SIGTERM each process (by its PID), then SIGKILL what is still there after ``grace_s``."""
    for p in procs:
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        if p is None:
            continue
        try:
            p.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# -- pushers and their connections -------------------------------------------------------------
def connections(fabric: Any, host: str, dst_ip: str, dport: int) -> set[tuple[str, int]]:
    """The established TCP connections from ``host`` to ``dst_ip:dport``: (source address,
    source port) as the kernel has them."""
    out = fabric.host(host).cmd(f"ss -tnH state established 'dst {dst_ip}:{dport}'")
    conns = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[-1] == f"{dst_ip}:{dport}":
            addr, _, port = parts[-2].rpartition(":")
            conns.add((addr, int(port)))
    return conns


def wait_connection(fabric: Any, host: str, src: tuple[str, int], dst: tuple[str, int],
                    proc: Any, what: str) -> None:
    """Wait until ``host`` holds the established connection ``src`` -> ``dst``."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while src not in connections(fabric, host, *dst):
        exited = proc is not None and proc.poll() is not None
        if exited or time.monotonic() > deadline:
            why = "the pusher exited" if exited else "timed out"
            raise MachineError("streams.media", f"{what}: no connection {src[0]}:{src[1]} -> "
                               f"{dst[0]}:{dst[1]} ({why})")
        time.sleep(0.05)


def push_argv(clip_path: Path, url: str) -> list[str]:
    """An anchor's pusher, or an origin stream's into its media server: the cached clip in a
    loop, in real time, copied (no encoding during a run)."""
    return ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "warning", "-re",
            "-stream_loop", "-1", "-i", str(clip_path), "-c", "copy", "-f", "flv", url]


def remove_hls(servers: list[Server]) -> None:
    """HLS segments are the run's scratch, not its results."""
    for s in servers:
        shutil.rmtree(s.dir / "hls", ignore_errors=True)
        shutil.rmtree(s.dir / "tmp", ignore_errors=True)
