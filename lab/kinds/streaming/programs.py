"""The streams' programs on the running edge: a phase's players (one per viewer host) and
senders started together on the lab's go, what each reported read back, and the probes
that trace each origin stream's uplink with its own 5-tuple.

``EdgePrograms`` is the part of ``lab.kinds.streaming.run.EdgeRun`` that does this.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab import agents
from lab.agents.common import cpu_seconds
from lab.kinds.streaming import media
from lab.kinds.streaming.plan import ORIGIN_ROLES, Stream
from lab.machine import programs
from lab.measure.routerstats import RouterPort
from lab.model.errors import MachineError
from lab.model.flows import EPHEMERAL_SYSCTL

if TYPE_CHECKING:
    from lab.net.fabric import Fabric


class EdgePrograms:
    """Starting the streams' programs and reading what they said (a part of ``EdgeRun``)."""

    fabric: Fabric
    params: dict[str, Any]
    desc: dict[str, Any]
    rports: list[RouterPort]

    media: str
    clips: dict[float, Path]
    servers: list[media.Server]

    def host(self, name: str) -> Any:
        return self.fabric.host(name)

    def probe(self, phase: str, flows: list[dict[str, Any]]) -> None:
        """TTL-limited probes with each origin stream's 5-tuple: which uplink does it hash to?

        The ISP answers from the address of the interface the probe arrived on
        (``icmp_errors_use_inbound_ifaddr``), which names the uplink; max TTL 3 (dccore,
        border, ISP) so no probe reaches the CDN node.
        """
        mine = [f for f in flows if f["role"] in ORIGIN_ROLES]
        if not mine:
            return
        by_addr = {a.split("/")[0]: (r["name"], intf) for r in self.desc["routers"]
                   for intf, addrs in r["interfaces"].items() for a in addrs}
        arg = json.dumps([[f["proto"], f["src_ip"], f["dst_ip"], f["sport"], f["dport"]]
                          for f in mine])
        origin = self.host(mine[0]["src"])
        out = origin.cmd(f"{shlex.join(agents.command('probe'))} --max-ttl 3 --timeout 2 "
                         f"--flows '{arg}'")
        start = out.find('{"flows"')
        traces = json.loads(out[start:])["flows"] if start >= 0 else [[] for _ in mine]
        for f, hops in zip(mine, traces, strict=True):
            uplink = None
            for hop in hops:
                _, intf = by_addr.get(hop["from"], (None, None))
                port = next((p for p in self.rports if p.peer_intf == intf
                             and p.role == "uplink" and p.node.startswith("border")), None)
                if port is not None:
                    uplink = port.name
            f["probe"] = {"hops": [{**h, "node": by_addr.get(h["from"], ("?", ""))[0],
                                    "intf": by_addr.get(h["from"], ("", "?"))[1]}
                                   for h in hops],
                          "uplink": uplink,
                          "agrees": uplink is not None and f["uplinks"] == [uplink]}

    def start_players(self, streams: list[Stream], work: Path, duration: float) -> list[Any]:
        procs = []
        by_dst: dict[str, list[Stream]] = {}
        for s in streams:
            by_dst.setdefault(s.dst, []).append(s)
        ready = []
        for dst, group in by_dst.items():
            rf = work / f"{dst}.ready"
            cmd = [*agents.command("streamer"), "play", "--proto", group[0].proto,
                   "--bind", group[0].dst_ip, "--port", str(group[0].dport),
                   "--streams", str(len(group)),
                   # A guard against senders that never come, not a schedule: the senders
                   # start after every player is ready, which may take programs.ready_timeout_s().
                   "--timeout", f"{duration + programs.ready_timeout_s() + 25:g}",
                   "--ready-file", str(rf), "--out", str(work / f"{dst}.play.json")]
            procs.append(programs.spawn(self.fabric, dst, cmd, work / f"{dst}.play.log",
                                        f"player {dst}", "players"))
            ready.append(rf)
        wait_ready(ready, procs, "players")
        return procs

    def start_senders(self, streams: list[Stream], work: Path, duration: float) -> list[Any]:
        procs = []
        sp = self.params["streams"]
        for s in streams:
            cmd = [*agents.command("streamer"), "send", "--stream-id",
                   str(s.stream_id), "--proto", s.proto, "--bind", s.src_ip, "--sport",
                   str(s.sport), "--dst", s.dst_ip, "--dport", str(s.dport), "--rate-mbps",
                   f"{s.rate_mbps:g}", "--fps", f"{sp['fps']:g}", "--duration", f"{duration:g}",
                   "--linger", "10", "--out", str(work / f"{s.stream_id}.send.json"),
                   "--ready-file", str(work / f"{s.stream_id}.send.ready")]
            if s.proto == "tcp":
                cmd += ["--cc", sp["cc"]]
            procs.append(programs.spawn(self.fabric, s.src, cmd,
                                        work / f"{s.stream_id}.send.log", f"sender {s.id}",
                                        "traffic"))
        # Every stream of the phase starts at once, when all are connected.
        programs.go([work / f"{s.stream_id}.send.ready" for s in streams], procs)
        return procs

    def read_stream(self, s: Stream, work: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            play = json.loads((work / f"{s.dst}.play.json").read_text())
            out["player"] = next((x for x in play["streams"] if x["stream_id"] == s.stream_id),
                                 None)
            # One player process serves every stream to its host: its CPU, shared out.
            out["player_cpu_s"] = float(play.get("cpu_s") or 0.0) / max(1, len(play["streams"]))
        except (OSError, ValueError, KeyError):
            out["player"] = None
        try:
            out["sender"] = json.loads((work / f"{s.stream_id}.send.json").read_text())
        except (OSError, ValueError):
            out["sender"] = None
        return out

    def programs_cpu(self, streams: list[Stream], servers_s: dict[str, float]
                     ) -> dict[str, Any]:
        """CPU seconds the phase's own programs used, per role: what a stream costs with
        this media (``servers_s``: each media server's, over the phase). A relay has no
        program of its own (it is the media server's nginx), so it is not counted."""
        streams = [s for s in streams if s.viewed]
        send = [float((s.summary.get("sender") or {}).get("cpu_s") or 0.0) for s in streams]
        play = [float(s.summary.get("player_cpu_s") or 0.0) for s in streams]
        return {"media": self.media, "streams": len(streams),
                "senders_s": round(sum(send), 3), "players_s": round(sum(play), 3),
                "servers_s": {h: round(v, 3) for h, v in servers_s.items()}}

    def start_streams(self, streams: list[Stream], work: Path, duration: float,
                      players: list[Any]) -> tuple[list[Any], list[Any], list[Any]]:
        """A phase's streams, started in its window: (senders, players, pushers) to wait
        for and stop. Synthetic senders start on the lab's go (their players already wait);
        real media flows from its pushers' start, and the viewers join once every stream
        is published."""
        if self.media == "real":
            pushers = self.start_pushers(streams, work)
            # A relay is watched where the stream it feeds ends: it has no viewer.
            viewed = [s for s in streams if s.viewed]
            return [], self.start_viewers(viewed, work, duration), pushers
        return self.start_senders(streams, work, duration), players, []

    def stop_pushers(self, streams: list[Stream], pushers: list[Any]) -> float:
        """Real pushers stream until stopped: stopped once the viewers have watched, so the
        window closes on drained queues as after a synthetic sender's end; their sockets'
        and processes' counters read first. Returns when (monotonic).

        ``pushers`` are ``start_pushers``' (one per stream but the relays, in order); the
        relay feeding an origin stream has its socket read with the stream's."""
        by_id = {s.id: s for s in streams}
        pushed = [s for s in streams if s.viewed]
        for s, proc in zip(pushed, pushers, strict=False):
            s.summary["tcp"] = self.relay_tcp(s)
            s.summary["pusher"]["cpu_s"] = cpu_seconds(proc.pid)
            if s.relayed_by is not None:
                by_id[s.relayed_by].summary["tcp"] = self.relay_tcp(by_id[s.relayed_by])
        stopped = time.monotonic()
        media.stop(pushers)
        return stopped

    # -- real media ---------------------------------------------------------------------------
    def media_servers(self) -> list[media.Server]:
        """nginx-rtmp on every media server (ingest), the origin and every CDN node; a media
        server pushes each origin stream published into it, by name, to the origin (its
        relay), and the origin pushes it on to the CDN node it is for."""
        ips = {h["name"]: h["ip"] for h in self.desc["hosts"] + self.desc["external_hosts"]}
        base = self.fabric.run_dir / "streams" / "servers"
        pushes: dict[str, dict[str, str]] = {}
        for s in self.streams:
            if s.role != "ingest":
                pushes.setdefault(s.src, {})[stream_name(s)] = s.dst_ip
        roles = [(h["name"], "ingest") for h in self.desc["hosts"] if h.get("role") == "media"]
        roles += [(h["name"], "origin") for h in self.desc["hosts"] if h.get("role") == "origin"]
        roles += sorted({(s.dst, "cdn") for s in self.streams if s.role in ORIGIN_ROLES})
        return [media.Server(host=h, ip=ips[h], role=role, dir=base / h,
                             pushes=pushes.get(h, {})) for h, role in roles]

    def start_pushers(self, streams: list[Stream], work: Path) -> list[Any]:
        """A phase's pushers, one after another (one per stream but the relays, in order),
        each connection across the network on its planned 5-tuple: an anchor's into its
        media server; for an origin stream, its media server's relay to the origin and the
        origin's push on to the CDN node.

        Neither ffmpeg nor nginx's relay can choose a source port, so each sending host's
        ephemeral range is narrowed to its connection's one port while it connects (the
        range is per namespace, and a port may serve several destinations: the local
        publish into the media server takes the relay's too), then put back. The counters,
        hash seeds and pins then hold for the real connections as planned.
        """
        relays = {s.relay_of: s for s in streams if s.relay_of is not None}
        procs = []
        for s in streams:
            if not s.viewed:
                continue
            # An anchor publishes across the edge into its media server; an origin stream's
            # ffmpeg publishes into its media server's own nginx, which relays it by name to
            # the origin's, which pushes it on.
            hops = [s] if s.role == "ingest" else [relays[s.id], s]
            at = hops[0].src
            url_ip = s.dst_ip if s.role == "ingest" else hops[0].src_ip
            argv = media.push_argv(self.clips[s.rate_mbps],
                                   f"rtmp://{url_ip}:{media.RTMP_PORT}/live/{stream_name(s)}")
            try:
                for h in hops:
                    self.host(h.src).cmd("sysctl -qw net.ipv4.ip_local_port_range="
                                         f"'{h.sport} {h.sport}'")
                t0, epoch = time.monotonic(), time.time()
                proc = programs.spawn(self.fabric, at, argv,
                                      work / f"{s.stream_id}.push.log", f"ffmpeg pusher {s.id}",
                                      "media")
                procs.append(proc)
                for h in hops:
                    media.wait_connection(self.fabric, h.src, (h.src_ip, h.sport),
                                          (h.dst_ip, h.dport), proc, f"stream {h.id}")
            finally:
                for h in hops:
                    self.host(h.src).cmd(f"sysctl -qw {EPHEMERAL_SYSCTL}")
            s.summary = {"pusher": {"t0_monotonic": t0, "publish_epoch": epoch,
                                    "pid": proc.pid}}
        return procs

    def start_viewers(self, streams: list[Stream], work: Path, duration: float) -> list[Any]:
        """One real RTMP viewer per stream, where the synthetic player would be: at the CDN
        node for an origin stream, at the media server for an anchor's push; and for every
        origin stream an HLS viewer at its CDN node, and for the first big stream hls.js in
        a headless browser (where installed), the check on the viewers' stall counts."""
        procs, ready = self.start_hls_viewers(streams, work, duration)
        fps = float(self.params["streams"]["fps"])
        for s in streams:
            rf = work / f"{s.stream_id}.view.ready"
            cmd = [*agents.command("rtmpview"), "--stream-id", str(s.stream_id),
                   "--url", f"rtmp://{s.dst_ip}:{media.RTMP_PORT}/live/{stream_name(s)}",
                   "--duration", f"{duration:g}", "--fps", f"{fps:g}",
                   "--publish-epoch", f"{s.summary['pusher']['publish_epoch']:.6f}",
                   "--ready-file", str(rf), "--out", str(work / f"{s.stream_id}.view.json"),
                   *self.live_file_args(work, s.stream_id, "view")]
            procs.append(programs.spawn(self.fabric, s.dst, cmd,
                                        work / f"{s.stream_id}.view.log", f"viewer {s.id}",
                                        "players"))
            ready.append(rf)
        wait_ready(ready, procs, "viewers")
        return procs

    def start_hls_viewers(self, streams: list[Stream], work: Path,
                          duration: float) -> tuple[list[Any], list[Path]]:
        """The HLS viewers (``hlsview`` for every origin stream, ``hlsjsview`` for the first
        big one): they play :data:`media.HLS_LAG_S` behind live, so they watch that much
        longer to see the whole phase."""
        procs, ready = [], []
        origin = [s for s in streams if s.role != "ingest"]
        browser = next((s for s in origin if s.role == "big"), None) \
            if media.browser(self.params) else None
        for s in origin:
            url = f"http://{s.dst_ip}:{media.HLS_PORT}/hls/{stream_name(s)}.m3u8"
            common = ["--url", url, "--stream-id", str(s.stream_id),
                      "--duration", f"{duration + media.HLS_LAG_S:g}",
                      "--publish-epoch", f"{s.summary['pusher']['publish_epoch']:.6f}"]
            for agent, what in (("hlsview", "hls"), ("hlsjsview", "hlsjs")):
                if agent == "hlsjsview" and s is not browser:
                    continue
                rf = work / f"{s.stream_id}.{what}.ready"
                cmd = [*agents.command(agent), *common, "--ready-file", str(rf),
                       "--out", str(work / f"{s.stream_id}.{what}.json"),
                       *self.live_file_args(work, s.stream_id, what)]
                procs.append(programs.spawn(self.fabric, s.dst, cmd,
                                            work / f"{s.stream_id}.{what}.log",
                                            f"viewer {what} {s.id}",
                                            "browser" if agent == "hlsjsview" else "players"))
                ready.append(rf)
        return procs, ready

    def relay_tcp(self, s: Stream) -> dict[str, Any]:
        """The stream's sending socket as the kernel saw it (``ss -ti``): retransmits and
        the congestion control's state, from the pusher's side (nginx's: the origin's push
        for an origin stream, the media server's for a relay)."""
        out = self.host(s.src).cmd(f"ss -tinH state established 'src {s.src_ip}:{s.sport} "
                                   f"dst {s.dst_ip}:{s.dport}'")
        info: dict[str, Any] = {}
        for tok in out.split():
            key, _, val = tok.partition(":")
            if key == "retrans" and "/" in val:
                info["total_retrans"] = int(val.split("/")[1])
            elif key in ("cwnd", "rtt", "bytes_sent", "bytes_retrans") and val:
                info[key] = val
        return info

    def read_view(self, s: Stream, work: Path, stopped: float) -> dict[str, Any]:
        """A real stream's summary: its viewer's, and its pusher's times and socket. A relay
        has only its socket: no viewer, and its pusher is the stream's it feeds."""
        if not s.viewed:
            return {"player": None, "players": None, "player_cpu_s": 0.0,
                    "sender": {"media": "real", "tcp": s.summary.get("tcp", {})}}
        viewer_cpu = 0.0
        try:
            view = json.loads((work / f"{s.stream_id}.view.json").read_text())
            player = view["streams"][0]
            viewer_cpu = float(view.get("cpu_s") or 0.0) + \
                float((view.get("ffprobe") or {}).get("cpu_s") or 0.0)
        except (OSError, ValueError, KeyError, IndexError):
            player = None
        pusher = s.summary.get("pusher", {})
        # What a phase's CPU is judged over (``t0_monotonic``, ``elapsed_s``): while this
        # viewer played, from its playback's start to the end of its watch. Starting a
        # phase's pushers and viewers (a dozen processes) and the viewers' exit are the
        # lab's set-up and teardown, as a synthetic sender's start and end are.
        p = player or {}
        t0, elapsed = pusher.get("t0_monotonic"), stopped - pusher.get("t0_monotonic", stopped)
        if p.get("join_unix") is not None and p.get("startup_delay_s") is not None:
            to_mono = time.monotonic() - time.time()
            t0 = p["join_unix"] + p["startup_delay_s"] + to_mono
            elapsed = p["join_unix"] + float(p.get("watch_s") or 0.0) + to_mono - t0
        sender = {"media": "real", "pushed_monotonic": pusher.get("t0_monotonic"),
                  "t0_monotonic": t0, "elapsed_s": elapsed, "tcp": s.summary.get("tcp", {}),
                  "cpu_s": pusher.get("cpu_s")}
        players = {"rtmp": player_line(player)}
        for what in ("hls", "hlsjs"):
            try:
                other = json.loads((work / f"{s.stream_id}.{what}.json").read_text())
                players[what] = player_line(other["streams"][0])
                viewer_cpu += float(other.get("cpu_s") or 0.0) if what == "hls" else 0.0
            except (OSError, ValueError, KeyError, IndexError):
                continue
        return {"player": player, "sender": sender, "player_cpu_s": viewer_cpu,
                "players": players}


def wait_ready(ready: list[Path], procs: list[Any], what: str) -> None:
    """Every player (or viewer) says it is ready by its file; one that died is reported at
    once, one that hangs once ``programs.ready_timeout_s()`` is over."""
    dead, waiting = programs.wait_ready(ready, procs, stop_at_death=True)
    if dead or waiting:
        raise MachineError("streams", f"{what} not ready "
                           f"({'exited' if dead else 'timed out'}): {dead or waiting}")


def player_line(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """What each real player of a stream reported, side by side in the result."""
    if summary is None:
        return None
    keep = ("protocol", "player", "startup_delay_s", "stalls", "stall_s", "rebuffer_ratio",
            "live_latency_s", "stall_events", "join_unix", "frames_dropped", "end_reason")
    return {k: summary[k] for k in keep if k in summary}


def stream_name(s: Stream) -> str:
    """A stream's RTMP name: unique in the run (the phase is part of it), so the servers'
    pushes can be configured for the whole run at once. A relay carries the name of the
    origin stream it feeds."""
    return (s.relay_of or s.id).replace("/", "-")
