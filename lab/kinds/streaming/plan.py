"""The streaming kind's scenario and its streams: the keys it takes, the phases it runs and every
stream of every phase, 5-tuples drawn from the seed - checked before anything starts."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lab.kinds.streaming.media import BROWSER_CHOICES, MEDIA_CHOICES, RTMP_PORT, browser, resolve
from lab.model.errors import ScenarioError
from lab.model.flows import FIXED_SPORTS, FlowSpec
from lab.model.scenario import Param, require
from lab.net.edgecontrol import FiveTuple

if TYPE_CHECKING:
    from lab.kinds.base import Plan

PHASES = ("before-upgrade", "incident", "fix-hash", "fix-placement", "failover-link",
          "failover-border")
PLAYER_PORT_BASE = 9000
#: The origin's streams: what it sends across the edge, each to a CDN node. With real media
#: each one reaches the origin first as a ``relay`` from an ingest media server.
ORIGIN_ROLES = ("big", "normal")
#: Keys a scenario may leave out: the media (see ``media.resolve``), real media's GOP and
#: its browser viewer (``media.browser``).
OPTIONAL = ("phases", "streams.media", "streams.gop_s", "streams.browser")
DEFAULT_GOP_S = 1.0

SCHEMA: dict[str, Param] = {
    "streams.proto": Param(str, choices=("tcp", "udp")),
    "streams.fps": Param(float, 1, 120),
    "streams.ingest_mbps": Param(float, 0.1, 50),
    "streams.normal_mbps": Param(float, 0.1, 50),
    "streams.big_mbps": Param(float, 0.1, 100),
    "streams.cc": Param(str, choices=("cubic", "reno", "bbr")),
    # real: ffmpeg pushers, nginx-rtmp servers and RTMP viewers; synthetic: the lab's own
    # sender and player. Default: real where ffmpeg and nginx-rtmp are installed.
    "streams.media": Param(str, choices=MEDIA_CHOICES),
    "streams.gop_s": Param(float, 0.1, 10),
    # The hls.js viewer in headless Chromium on the first big stream (real media): auto
    # (where installed), always (required), never.
    "streams.browser": Param(str, choices=BROWSER_CHOICES),
    "before.uplink_bw": Param(float, 1, 1000),
    "before.servers": Param(int, 1, 32),
    "before.big_streams": Param(int, 1, 32),
    "before.big_mbps": Param(float, 0.1, 100),
    "after.servers": Param(int, 1, 32),
    "after.big_streams": Param(int, 1, 32),
    "after.normal_streams": Param(int, 0, 32),
    "failover.cut_at": Param(float, 0.5, 600),
    "failover.restore_at": Param(float, 1, 600),
    "phases": Param(str),
}


@dataclass
class Stream:
    """One live stream: who pushes it where, its 5-tuple and bitrate.

    A ``relay`` is the hop before an origin stream (real media only): the media server's
    nginx pushing that stream on to the origin. It has no viewer of its own - what it
    delivers is watched at the end of the origin stream it feeds - so ``relay_of`` names
    that stream, and the stream's ``relayed_by`` names the relay."""

    id: str
    phase: str
    role: str            # ingest | big | normal | relay
    src: str
    dst: str
    src_ip: str
    dst_ip: str
    sport: int
    dport: int
    rate_mbps: float
    proto: str
    stream_id: int
    index: int           # global index: its OVS watch cookies
    summary: dict[str, Any] = field(default_factory=dict)
    relay_of: str | None = None
    relayed_by: str | None = None

    @property
    def viewed(self) -> bool:
        """Whether a viewer of its own watches it: all but a relay."""
        return self.relay_of is None

    @property
    def tuple(self) -> FiveTuple:
        return FiveTuple(self.src_ip, self.dst_ip, self.proto, self.sport, self.dport)

    def spec(self) -> FlowSpec:
        return FlowSpec(id=self.id, src=self.src, dst=self.dst, src_ip=self.src_ip,
                        dst_ip=self.dst_ip, proto=self.proto, sport=self.sport,
                        dport=self.dport, rate_bps=self.rate_mbps * 1e6, kind="stream")


def phase_names(params: dict[str, Any]) -> list[str]:
    wanted = str(params.get("phases", "all"))
    if wanted == "all":
        return list(PHASES)
    names = [p.strip() for p in wanted.split(",") if p.strip()]
    if not names:
        raise ScenarioError("phases", f"names no phase (give all, or some of: "
                            f"{', '.join(PHASES)})")
    for n in names:
        if n not in PHASES:
            raise ScenarioError("phases", f"unknown phase {n!r} (known: {', '.join(PHASES)})")
    return [p for p in PHASES if p in names]


def topology_defaults(params: dict[str, Any]) -> dict[str, Any]:
    """What the edge needs for the phases asked for, where the scenario does not say: BFD on
    its sessions only when a failover phase has a cut for it to notice."""
    return {"bfd": any(p.startswith("failover") for p in phase_names(params))}


def check(params: dict[str, Any], topo_desc: dict[str, Any]) -> None:
    """Cross-field checks the per-key schema cannot make."""
    tp = topo_desc["params"]
    if topo_desc["type"] != "streaming-edge":
        raise ScenarioError("topology.type", "the streaming kind needs a streaming-edge topology")
    # Every value but the optional ones is used and has no default.
    require(params, [k for k in SCHEMA if k not in OPTIONAL], "streaming")
    sp = params["streams"]
    sp.setdefault("gop_s", DEFAULT_GOP_S)
    browser(params)                # asked for and impossible: said before anything starts
    if sp.get("media") == "real" and sp["proto"] != "tcp":
        raise ScenarioError("streams.proto", "real media is RTMP, over TCP (or "
                            "streams.media: synthetic for UDP)")
    if sp["gop_s"] > params["duration"]:
        raise ScenarioError("streams.gop_s", f"a GOP of {sp['gop_s']:g} s is longer than "
                            f"the phase (duration {params['duration']:g} s): no viewer "
                            "would see a keyframe twice")
    for key in ("before.servers", "after.servers"):
        sec, leaf = key.split(".")
        if params[sec][leaf] > tp["servers"]:
            raise ScenarioError(key, f"{params[sec][leaf]} servers, but the topology has "
                                f"{tp['servers']} (topology.servers)")
    f = params["failover"]
    if f["restore_at"] <= f["cut_at"]:
        raise ScenarioError("failover.restore_at", "must come after failover.cut_at")
    if f["restore_at"] >= params["duration"]:
        raise ScenarioError("failover.restore_at", f"must fall inside the phase "
                            f"(duration {params['duration']:g} s)")
    failover = any(p.startswith("failover") for p in phase_names(params))
    if failover and not tp.get("bfd", True):
        raise ScenarioError("topology.bfd", "the failover phases need BFD to notice a silent "
                            "cut (leave topology.bfd out, or the failover phases)")


def streams(topo_desc: dict[str, Any], params: dict[str, Any],
            rng: random.Random) -> list[Stream]:
    """Every stream of every phase, 5-tuples drawn from the seed.

    With real media every origin stream also has its ``relay``: published into an ingest
    media server (the phase's servers in turn), whose nginx pushes it on to the origin. The
    relays come last and draw their ports after every other stream, so the streams the
    incident is about keep the 5-tuples the seed gave them without relays."""
    check(params, topo_desc)
    s, before, after = params["streams"], params["before"], params["after"]
    ips = {h["name"]: h["ip"] for h in topo_desc["hosts"]}
    ips.update({h["name"]: h["ip"] for h in topo_desc["external_hosts"]})
    media = sorted((h["name"] for h in topo_desc["hosts"] if h.get("role") == "media"),
                   key=lambda n: int(n[1:]))
    origin = next(h["name"] for h in topo_desc["hosts"] if h.get("role") == "origin")
    isps = topo_desc["params"]["isps"]
    cdns = [f"cdn{i}" for i in range(1, isps + 1)]
    out: list[Stream] = []
    used: set[int] = set()
    real = resolve(params) == "real"
    relayed: list[tuple[list[str], list[Stream]]] = []   # per phase: its servers, streams
    for p_index, phase in enumerate(phase_names(params)):
        early = phase == "before-upgrade"
        servers = before["servers"] if early else after["servers"]
        mix = [("ingest", f"anchor{k % isps + 1}", media[k], s["ingest_mbps"])
               for k in range(servers)]
        big_n = before["big_streams"] if early else after["big_streams"]
        big_rate = before["big_mbps"] if early else s["big_mbps"]
        mix += [("big", origin, cdns[0], big_rate)] * big_n
        normal_n = 0 if early else after["normal_streams"]
        mix += [("normal", origin, cdns[(k + 1) % len(cdns)], s["normal_mbps"])
                for k in range(normal_n)]
        sports = rng.sample(FIXED_SPORTS, len(mix))
        for k, port in enumerate(sports):
            # A source port once per run: a closed connection's TIME_WAIT holds its 4-tuple
            # for a minute, and real media reconnects to the same server every phase.
            while port in used or port in sports[k + 1:]:
                port = rng.choice(FIXED_SPORTS)
            sports[k] = port
            used.add(port)
        for k, (role, src, dst, rate) in enumerate(mix):
            out.append(Stream(id=f"{phase}/{role}{k + 1}", phase=phase, role=role, src=src,
                              dst=dst, src_ip=ips[src], dst_ip=ips[dst], sport=sports[k],
                              dport=RTMP_PORT if real else PLAYER_PORT_BASE + p_index,
                              rate_mbps=float(rate),
                              proto=s["proto"], stream_id=k + 1, index=len(out)))
        relayed.append((media[:servers], out[len(out) - len(mix):]))
    if real:
        for servers_of, phase_streams in relayed:
            out += relays(servers_of, phase_streams, ips, used, rng, len(out))
    return out


def relays(servers: list[str], phase_streams: list[Stream], ips: dict[str, str],
           used: set[int], rng: random.Random, index: int) -> list[Stream]:
    """A phase's relays: each origin stream from one of ``servers`` (in turn) to the origin,
    at the stream's rate, on a source port no other stream of the run has (``used``, which
    this adds to); numbered after the phase's other streams, counter cookies from ``index``."""
    out = []
    origin_streams = [st for st in phase_streams if st.role in ORIGIN_ROLES]
    for j, st in enumerate(origin_streams):
        port = rng.choice(FIXED_SPORTS)
        while port in used:
            port = rng.choice(FIXED_SPORTS)
        used.add(port)
        num = len(phase_streams) + j + 1
        src = servers[j % len(servers)]
        relay = Stream(id=f"{st.phase}/relay{num}", phase=st.phase, role="relay", src=src,
                       dst=st.src, src_ip=ips[src], dst_ip=st.src_ip, sport=port,
                       dport=RTMP_PORT, rate_mbps=st.rate_mbps, proto=st.proto,
                       stream_id=num, index=index + len(out), relay_of=st.id)
        st.relayed_by = relay.id
        out.append(relay)
    return out


def warnings(plan: Plan) -> list[str]:
    """The kind's warnings before the start: streams above their hosts' access links."""
    return access_warnings(plan.topo_desc, plan.flows)


def access_warnings(topo_desc: dict[str, Any], streams: list[Stream]) -> list[str]:
    """Where a phase's streams out of one host, or into one, add up to more than its access
    link: a warning before the start (the run still shows what happens), naming the host,
    the phase and the key that sets the link's rate.

    Each way on its own: a link is shaped per direction, so the origin's relays coming in
    do not take from the streams going out."""
    bw: dict[str, tuple[float, str]] = {}
    for ln in topo_desc["links"]:
        for end in ("a", "b"):
            if any(h["name"] == ln[end] for h in topo_desc["hosts"]):
                bw[ln[end]] = (float(ln["bw_mbps"]), "topology.host_bw")
    for ln in topo_desc["router_links"]:
        if any(h["name"] == ln["b"] for h in topo_desc["external_hosts"]):
            bw[ln["b"]] = (float(ln["bw_mbps"]), "topology.access_bw")
    load: dict[tuple[str, str, str], float] = {}
    for st in streams:
        for host, way in ((st.src, "out of"), (st.dst, "into")):
            load[(st.phase, host, way)] = load.get((st.phase, host, way), 0.0) + st.rate_mbps
    out = []
    for (phase, host, way), mbps in load.items():
        if host in bw and mbps > bw[host][0]:
            out.append(f"warning: [{phase}] streams {way} {host} add up to {mbps:g} Mbit/s, "
                       f"above its access link ({bw[host][0]:g} Mbit/s, {bw[host][1]})")
    return out
