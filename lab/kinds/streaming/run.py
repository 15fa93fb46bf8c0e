"""The streaming kind's run: the edge brought up (fabric, FRR routers, BGP), the phases one
after another on it, and the logs kept afterwards.

``EdgeRun`` is the running edge: it sets each phase up (``lab.kinds.streaming.setup``),
starts the players and senders (``lab.kinds.streaming.programs``), cuts and restores for
the failover phases (``lab.kinds.streaming.failover``) and reads what the routers and the
fabric counted; ``lab.kinds.streaming.metrics`` turns that into the kind's part of
result.json.
"""

from __future__ import annotations

import itertools
import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab.agents.common import cpu_seconds
from lab.kinds.base import Plan, Progress
from lab.kinds.streaming import media, metrics
from lab.kinds.streaming.failover import EdgeFailover
from lab.kinds.streaming.liveview import EdgeLiveView
from lab.kinds.streaming.plan import ORIGIN_ROLES, Stream, phase_names
from lab.kinds.streaming.programs import EdgePrograms
from lab.kinds.streaming.setup import EdgeSetup
from lab.machine.progress import Ticker
from lab.measure import headroom, routerstats, telemetry
from lab.measure.window import Window
from lab.model.flowpaths import adjacency, attachment
from lab.net import edgecontrol, frr
from lab.net.edge import CORE, GATEWAY_IP
from lab.net.links import root_netem_delay_ms

if TYPE_CHECKING:
    from lab.net.fabric import Fabric

#: Phases after which every origin stream is traced with its own 5-tuple (scapy), routing
#: still as it was: the operator's confirmation of what the counters say.
PROBE_PHASES = ("incident", "fix-hash")


def prepare(plan: Plan) -> dict[str, Any]:
    """Which media the run streams, and for real media each bitrate's cached clip (encoded
    here on first use, before anything starts)."""
    kind = media.resolve(plan.params)
    clips: dict[float, Any] = {}
    if kind == "real":
        sp = plan.params["streams"]
        for rate in sorted({s.rate_mbps for s in plan.flows}):
            clips[rate] = media.clip(rate, float(sp["fps"]), float(sp["gop_s"]))
    return {"media": kind, "clips": clips}


def on_fabric(plan: Plan, fabric: Fabric, progress: Progress,
              prepared: dict[str, Any] | None = None) -> dict[str, Any]:
    """Bring the edge up (fabric, FRR routers, BGP), then the phases one after another;
    returns the kind's part of result.json."""
    prepared = prepared or prepare(plan)
    fabric.gateways = frozenset({CORE})
    progress(f"bringing up streaming-edge: {len(plan.topo_desc['switches'])} switches, "
             f"{len(plan.topo_desc['routers'])} FRR routers, controller "
             f"{plan.runtime}")
    fabric.start()
    edge = EdgeRun(plan, fabric, progress, prepared)
    timings = edge.start_routing()
    fabric.timings.update(timings)
    progress(f"BGP up: sessions in {timings['bgp_established_s']:.2f} s, multipath "
             f"routes in {timings['routing_ready_s']:.2f} s")
    bgp = edge.bgp_state()
    wan = edge.wan_delay()
    edge.watch(edge.streams)
    if edge.media == "real":
        edge.start_media()
        progress(f"real media: nginx-rtmp on {len(edge.servers)} hosts "
                 f"({', '.join(s.host for s in edge.servers)}), ffmpeg pushers, RTMP viewers")
    edge.start_sampling()
    phases: dict[str, Any] = {}
    measured: dict[str, float] = {}
    try:
        for i, phase in enumerate(phase_names(plan.params)):
            phases[phase] = edge.run_phase(phase, i, measured)
            if phase == "incident":
                measured = {f["id"]: f["bytes"] * 8 / phases[phase]["duration_s"] / 1e6
                            for f in phases[phase]["flows"]}
            progress(f"[{phase}] " + metrics.phase_line(metrics.phase_metrics(phases[phase])))
    finally:
        edge.sampler.stop()
        edge.rsampler.stop()
        edge.stop_media()
    bgp_after = edge.bgp_state()
    part = metrics.assemble(plan, phases, bgp, bgp_after, wan)
    part["metrics"]["media"] = edge.media
    return part


def keep_logs(work: Path, out_dir: Path) -> None:
    """The routers' logs and the streams' JSON (the controller's log is kept by every run)."""
    for log in work.glob("*/*.log"):
        (out_dir / "frr" / log.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(log, out_dir / "frr" / log.parent.name / log.name)
    if (work / "streams").is_dir():
        shutil.copytree(work / "streams", out_dir / "streams", dirs_exist_ok=True)


class EdgeRun(EdgeSetup, EdgePrograms, EdgeFailover, EdgeLiveView):
    """The running edge: fabric, routers, counters; runs one phase after the other.

    Its parts by what a phase does: set up the routing (``EdgeSetup``), start the streams'
    programs and probe their paths (``EdgePrograms``), cut and restore (``EdgeFailover``),
    show the viewers' lanes in a live view (``EdgeLiveView``); here the bring-up and the
    phase itself, inside one measurement window."""

    def __init__(self, plan: Plan, fabric: Fabric, progress: Progress,
                 prepared: dict[str, Any]) -> None:
        self.plan = plan
        self.media: str = prepared["media"]
        self.clips = prepared["clips"]
        self.servers: list[media.Server] = []
        self.fabric = fabric
        self.progress = progress
        self.params = plan.params
        self.desc = plan.topo_desc
        self.streams: list[Stream] = plan.flows
        self.routers = {r["name"]: fabric.host(r["name"]) for r in self.desc["routers"]}
        self.pids = {name: node.pid for name, node in self.routers.items()}
        self.rports = routerstats.router_ports(self.desc)
        self.intfs = {r["name"]: list(r["interfaces"]) for r in self.desc["routers"]}
        self.port_at = {(p.node, p.intf): p for p in self.rports}
        self.att = attachment(self.desc)
        self.adj = adjacency(self.desc)
        self.bridges = [sw["name"] for sw in self.desc["switches"]]
        self.fports = telemetry.fabric_ports(self.desc)
        self.seed = int(self.params["seed"])
        self.base_seeds = {name: 1 + (self.seed * 7919 + i * 104729) % 65521
                           for i, name in enumerate(sorted(self.routers))}
        self.pinned: dict[str, list[int]] = {}

    # -- bring-up beyond the fabric ----------------------------------------------------------
    def start_routing(self) -> dict[str, float]:
        t0 = time.monotonic()
        shutil.chown(self.fabric.run_dir, frr.FRR_USER, frr.FRR_USER)
        for h in self.desc["hosts"]:
            if h.get("role") in ("media", "origin"):
                self.fabric.host(h["name"]).cmd(f"ip route replace default via {GATEWAY_IP}")
        for name, node in self.routers.items():
            # Traceroute answers name the interface a probe arrived on, at any rate.
            node.cmd("sysctl -qw net.ipv4.icmp_errors_use_inbound_ifaddr=1 "
                     "net.ipv4.icmp_ratelimit=0")
            routerstats.install_flow_counters(node.pid, self.intfs[name])
            edgecontrol.set_hash(node, "l3", self.base_seeds[name])
        frr_s = frr.start_routers(list(self.routers.values()), self.fabric.topo.bgp,
                                  self.fabric.run_dir, self.fabric.record)
        # The routers' control plane below the datapath, as every program the lab starts:
        # at normal priority, a failover's BGP and route installs took the CPU the
        # forwarding needed (the failover phases were the CPU-bound ones).
        for r in self.routers.values():
            for d in r.daemons.values():
                self.fabric.cpu.add(d["pid"], "routers")
        est = max(r.wait_established(20) for r in self.routers.values())
        # Multipath is complete when every router holds every prefix with all its paths.
        deadline = time.monotonic() + 20
        for (r, prefix), n in self.expected_paths().items():
            self.routers[r].wait_nexthops(prefix, n, max(0.1, deadline - time.monotonic()))
        return {"frr_start_s": frr_s, "bgp_established_s": est,
                "routing_ready_s": time.monotonic() - t0}

    def expected_paths(self) -> dict[tuple[str, str], int]:
        """(router, prefix) -> nexthops it must hold: one per parallel link towards it."""
        tp = self.desc["params"]
        isps = [r for r in self.desc["routers"] if r["name"].startswith("isp")]
        want = {}
        for r in self.desc["routers"]:
            name = r["name"]
            if name.startswith("isp"):
                want[(name, "10.0.0.0/8")] = tp["borders"] * tp["uplinks"]
                continue
            per_isp = tp["uplinks"] if name.startswith("border") else \
                tp["borders"] * tp["core_links"]
            for isp in isps:
                for net in isp["networks"]:
                    want[(name, net)] = per_isp
            if name.startswith("border"):
                want[(name, "10.0.0.0/8")] = tp["core_links"]
        return want

    def start_media(self) -> None:
        """The real media servers, for the whole run; the sending hosts' TCP congestion
        control is the scenario's (nginx's relays and ffmpeg use the namespace's default)."""
        for h in {s.src for s in self.streams}:
            self.fabric.host(h).cmd("sysctl -qw net.ipv4.tcp_congestion_control="
                                    f"{self.params['streams']['cc']}")
        self.servers = self.media_servers()
        media.start_servers(self.fabric, self.servers)

    def stop_media(self) -> None:
        media.stop([s.proc for s in self.servers])
        media.remove_hls(self.servers)

    def start_sampling(self) -> None:
        """Fabric ports and router ports, sampled on one clock for the whole run."""
        self.sampler = telemetry.Sampler(self.fports, hz=telemetry.SAMPLE_HZ,
                                         controller=self.fabric.controller,
                                         classes=self.fabric.cpu)
        self.sampler.start()
        while not self.sampler.t0:        # t0 is set by the sampler thread itself
            time.sleep(0.005)
        self.rsampler = routerstats.RouterSampler(self.pids, self.rports, self.sampler.t0,
                                                  hz=telemetry.SAMPLE_HZ)
        self.rsampler.start()

    def wan_delay(self) -> dict[str, float | None]:
        """{uplink port: one-way delay (ms) its root netem has}, read back from the kernel:
        what the uplinks got, not what was asked (without netem they get nothing)."""
        out: dict[str, float | None] = {}
        for p in self.rports:
            if p.role != "uplink":
                continue
            shown = routerstats.ns_run(self.pids[p.node], ["tc", "-j", "qdisc", "show",
                                                           "dev", p.intf], check=False).stdout
            try:
                qdiscs = json.loads(shown) if shown.strip() else []
            except ValueError:
                qdiscs = []
            out[p.name] = root_netem_delay_ms(qdiscs)
        return out

    def bgp_state(self) -> dict[str, Any]:
        """Each router's sessions (FRR's word) and its multipath routes (the kernel's)."""
        out = {}
        for name, node in self.routers.items():
            peers = node.bgp_summary().get("peers", {})
            routes = {}
            for (r, prefix), _n in self.expected_paths().items():
                if r == name:
                    routes[prefix] = [h["dev"] for h in node.kernel_nexthops(prefix)]
            out[name] = {"sessions": [{"peer": a, "state": p.get("state"),
                                       "prefixes": p.get("pfxRcd", 0),
                                       "host": p.get("desc", "")}
                                      for a, p in sorted(peers.items())],
                         "multipath_routes": routes}
        return out

    def run_phase(self, phase: str, index: int, measured: dict[str, float]) -> dict[str, Any]:
        duration = float(self.params["duration"])
        marks = [("start", time.monotonic())]
        servers0 = {sv.host: cpu_seconds(sv.proc.pid) or 0.0 for sv in self.servers}
        streams = [s for s in self.streams if s.phase == phase]
        work = self.fabric.run_dir / "streams" / phase
        work.mkdir(parents=True, exist_ok=True)
        real = self.media == "real"
        config = self.configure(phase, measured)
        marks.append(("configure", time.monotonic()))
        players = [] if real else self.start_players(streams, work, duration)
        marks.append(("players", time.monotonic()))
        window = Window(self.sampler, self.fports, self.bridges, name=phase)
        before_r = routerstats.snapshot(self.pids, self.rports)
        nft0 = {n: routerstats.read_flow_counters(p, self.intfs[n]) for n, p in self.pids.items()}
        window.open()
        t_unix = time.time()
        senders, players, pushers = self.start_streams(streams, work, duration, players)
        relays = sum(1 for s in streams if not s.viewed)
        self.progress(f"[{phase}] {len(streams) - relays} streams"
                      + (f" (and {relays} relays to the origin)" if relays else "")
                      + f" for {duration:g} s (uplinks {config['uplink_bw_mbps']:g} Mbit/s)")
        # The phase's wall clock start: a report puts the players' timelines and the
        # links' series on one axis with it.
        events: dict[str, Any] = {"phase_start_unix": t_unix}
        if phase.startswith("failover"):
            # Cut and restore are timed from when the streams run, not from the phase's
            # start: real media takes seconds to start (pushers publish, viewers join),
            # and a cut before the viewers watch is an outage nobody could see.
            events = self.failover(phase, config, t_unix, time.time())
        with Ticker(duration, f"[{phase}] streaming"), \
                self.viewer_lanes(work, [s for s in streams if s.viewed] if real else []):
            for proc in senders + players:
                try:
                    proc.wait(timeout=duration + 30)
                except Exception:
                    proc.kill()
                    proc.wait()
        stopped = self.stop_pushers(streams, pushers)
        marks.append(("traffic", time.monotonic()))
        window.close()
        after_r = routerstats.snapshot(self.pids, self.rports)
        nft1 = {n: routerstats.read_flow_counters(p, self.intfs[n]) for n, p in self.pids.items()}
        t_start, t_end, measured_s = window.t_start, window.t_end, window.measured_s
        for s in streams:
            s.summary = self.read_view(s, work, stopped) if real else self.read_stream(s, work)
        ovs = window.flow_deltas()
        nft = {n: routerstats.delta(nft1[n], nft0[n]) for n in nft1}
        links = window.links()
        links += metrics.router_link_entries(self.rports, self.rsampler.series, before_r,
                                             after_r, measured_s, t_start, config)
        flows = [self.flow_entry(s, ovs, nft) for s in streams]
        cpu = self.programs_cpu(streams, {sv.host: (cpu_seconds(sv.proc.pid) or 0.0)
                                          - servers0[sv.host] for sv in self.servers})
        marks.append(("collect", time.monotonic()))
        if phase in PROBE_PHASES:
            self.probe(phase, flows)
        marks.append(("probe", time.monotonic()))
        sent = [x for s in streams if (x := s.summary.get("sender"))
                and x.get("t0_monotonic") is not None]
        t_fid, t_fid_end = metrics.fidelity_span(
            [(x["t0_monotonic"] - self.sampler.t0, x.get("elapsed_s") or 0.0) for x in sent],
            t_start, t_end, duration)
        judged = window.judge(t_fid, t_fid_end)
        return {"timings": {f"{b[0]}_s": round(b[1] - a[1], 3)
                            for a, b in itertools.pairwise(marks)},
                "config": config, "duration_s": round(measured_s, 3), "links": links,
                "programs_cpu": cpu,
                "flows": flows, "events": events, "cpu_idle_pct": judged["cpu_idle_pct"],
                "cpu_idle_min_pct": judged["cpu_idle_min_pct"],
                "lab_cpu_pct": judged["lab_cpu_pct"], "fidelity_window_s": judged["window_s"],
                **headroom.cpu_fields(judged)}

    def watch(self, streams: list[Stream]) -> None:
        """Per-flow counters in the fabric for ``streams`` (their cookies replace what the
        same streams were watched as before)."""
        watch = [e for s in streams for e in s.spec().watch_entries(s.index)]
        self.fabric.controller.request({"cmd": "watch", "flows": watch})   # raises if refused

    # -- result entries -----------------------------------------------------------------------
    def flow_entry(self, s: Stream, ovs: dict, nft: dict) -> dict[str, Any]:
        """``s``'s entry in result.json, its hops between routers from the routers' counters."""
        key = (s.src_ip, s.dst_ip, s.proto, s.sport, s.dport)
        # Where it would meet the routers: an anchor's push at its ISP, anything from the DC
        # at dccore (a relay, from a media server to the origin inside the fabric, never
        # reaches it: its counters there stay empty).
        start = self.isp_of(s.src) if s.role == "ingest" else CORE
        router_hops = metrics.router_path(self.intfs, self.port_at, key, start, nft)
        # The other way (its ACKs, a player's requests): from where the stream ends.
        back = (s.dst_ip, s.src_ip, s.proto, s.dport, s.sport)
        back_start = self.isp_of(s.dst) if s.role in ORIGIN_ROLES else CORE
        reverse_hops = metrics.router_path(self.intfs, self.port_at, back, back_start, nft)
        return metrics.flow_entry(s, ovs, self.att, self.adj, router_hops, reverse_hops)

