"""The running edge: FRR routers and their counters on the fabric, driven phase by phase.

``EdgeRun`` sets each phase up (uplink rates, the hash and its seeds, pinned routes), starts
the players and senders, cuts and restores links for the failover phases and reads what the
routers and the fabric counted; ``lab.kinds.streaming.metrics`` turns that into result.json.
"""

from __future__ import annotations

import itertools
import json
import shlex
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controllers.marking import htb_class_args
from lab import agents
from lab.kinds.base import Plan, Progress
from lab.kinds.streaming import metrics
from lab.kinds.streaming.streamplan import Stream
from lab.machine import programs
from lab.machine.progress import Ticker
from lab.measure import routerstats, telemetry
from lab.measure.window import Window
from lab.model.errors import MachineError
from lab.model.flowpaths import adjacency, attachment
from lab.net import edgecontrol, frr
from lab.net.edge import CORE, GATEWAY_IP
from lab.net.edgecontrol import FiveTuple
from lab.net.links import root_netem_delay_ms

if TYPE_CHECKING:
    from lab.net.fabric import Fabric

#: dccore's interface on the fabric (its port 0): where origin streams enter the routers.
CORE_FABRIC_INTF = f"{CORE}-eth0"
#: A seed search stops at the first seed pair whose predicted hottest uplink stays below
#: this share of its rate.
SEED_TARGET_UTIL = 0.7
SEED_TRIES = 64
#: Phases after which every origin stream is traced with its own 5-tuple (scapy), routing
#: still as it was: the operator's confirmation of what the counters say.
PROBE_PHASES = ("incident", "fix-hash")


class EdgeRun:
    """The running edge: fabric, routers, counters; runs one phase after the other."""

    def __init__(self, plan_: Plan, fabric: Fabric, progress: Progress) -> None:
        self.plan = plan_
        self.fabric = fabric
        self.progress = progress
        self.params = plan_.params
        self.desc = plan_.topo_desc
        self.streams: list[Stream] = plan_.flows
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

    def start_sampling(self) -> None:
        """Fabric ports and router ports, sampled on one clock for the whole run."""
        self.sampler = telemetry.Sampler(self.fports, hz=telemetry.SAMPLE_HZ,
                                         controller=self.fabric.controller)
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

    # -- one phase -----------------------------------------------------------------------------
    def configure(self, phase: str, measured: dict[str, float]) -> dict[str, Any]:
        """Rates, hash and placement for ``phase``; returns what was set, for the report."""
        tp = self.desc["params"]
        bw = self.params["before"]["uplink_bw"] if phase == "before-upgrade" \
            else tp["uplink_bw"]
        self.set_uplink_bw(bw)
        for name, tables in self.pinned.items():
            edgecontrol.unpin(self.routers[name], tables)
        self.pinned = {}
        config: dict[str, Any] = {"uplink_bw_mbps": bw}
        mine = [n for n in self.routers if not n.startswith("isp")]
        if phase in ("fix-hash", "failover-link", "failover-border"):
            config.update(self.seed_search(phase, bw))
        else:
            held = {name: edgecontrol.set_hash(node, "l3", self.base_seeds[name])
                    for name, node in self.routers.items()}
            config["hash"] = {n: {"mode": "l3", "seed": held[n]["seed"]} for n in mine}
        if phase == "fix-placement":
            config["placement"] = self.place_by_load(phase, measured)
        return config

    def set_uplink_bw(self, bw: float) -> None:
        for p in self.rports:
            if p.role == "uplink":
                out = self.routers[p.node].cmd(
                    f"tc class change dev {p.intf} parent 1: classid 1:1 {htb_class_args(bw)}; "
                    "echo __rc=$?")
                if not out.strip().endswith("__rc=0"):
                    raise MachineError("topology.uplink_bw", f"{p.intf}: {out.strip()}")
        self.uplink_bw = bw

    def egress(self, phase: str) -> list[Stream]:
        return [s for s in self.streams if s.phase == phase and s.role != "ingest"]

    def peer_of(self, node: str, intf: str) -> tuple[str, str]:
        p = self.port_at[(node, intf)]
        return p.peer, p.peer_intf

    def predict_uplinks(self, streams: list[Stream]) -> dict[str, str]:
        """stream id -> the uplink (``border-ethX->isp-ethY``) the kernel would choose."""
        first = edgecontrol.predict(self.routers[CORE], CORE_FABRIC_INTF,
                                    [s.tuple for s in streams])
        by_border: dict[tuple[str, str], list[Stream]] = {}
        for s, dev in zip(streams, first, strict=True):
            border, b_intf = self.peer_of(CORE, dev)
            by_border.setdefault((border, b_intf), []).append(s)
        out = {}
        for (border, b_intf), group in by_border.items():
            devs = edgecontrol.predict(self.routers[border], b_intf, [s.tuple for s in group])
            for s, dev in zip(group, devs, strict=True):
                _, pintf = self.peer_of(border, dev)
                out[s.id] = f"{dev}->{pintf}"
        return out

    def seed_search(self, phase: str, bw: float) -> dict[str, Any]:
        """L4 hash everywhere we own; seeds per tier tried until the elephants spread."""
        streams = self.egress(phase)
        best: tuple[float, int, dict[str, str]] | None = None
        seedable = True
        for attempt in range(SEED_TRIES):
            for name, node in self.routers.items():
                if not name.startswith("isp"):
                    held = edgecontrol.set_hash(node, "l4", self.tier_seed(name, attempt))
                    seedable = held["seed"] is not None
            pred = self.predict_uplinks(streams)
            load: dict[str, float] = {}
            for s in streams:
                load[pred[s.id]] = load.get(pred[s.id], 0.0) + s.rate_mbps
            hottest = max(load.values(), default=0.0) / bw
            if best is None or hottest < best[0]:
                best = (hottest, attempt, pred)
            if hottest <= SEED_TARGET_UTIL or not seedable:   # no seed: one hash to try
                break
        assert best is not None
        hottest, attempt, pred = best
        seeds = {}
        for name, node in self.routers.items():
            if not name.startswith("isp"):       # the ISPs are not ours: they keep L3
                held = edgecontrol.set_hash(node, "l4", self.tier_seed(name, attempt))
                seeds[name] = {"mode": "l4", "seed": held["seed"]}
        return {"hash": seeds, "seed_tries": attempt + 1, "seedable": seedable,
                "predicted_uplink": pred, "predicted_hottest_util": round(hottest, 3)}

    def tier_seed(self, name: str, attempt: int) -> int:
        """The seed a router of ours gets in seed-search ``attempt``: dccore and the borders
        step differently, so the two tiers never share a seed (the same hash at two tiers
        polarises: a border would send all it gets from one dccore bucket to one uplink)."""
        if name == CORE:
            return self.base_seeds[name] + attempt
        return self.base_seeds[name] + 7 * attempt + 1

    def place_by_load(self, phase: str, measured: dict[str, float]) -> dict[str, str]:
        """Greedy: biggest measured stream first, each onto the least-loaded uplink."""
        streams = self.egress(phase)
        twin = {s.id.split("/", 1)[1]: s for s in self.egress("incident")}
        uplinks = [p for p in self.rports if p.role == "uplink" and p.node.startswith("border")]
        load = {p.name: 0.0 for p in uplinks}
        core_rules: list[tuple[FiveTuple, str, str]] = []
        border_rules: dict[str, list[tuple[FiveTuple, str, str]]] = {}
        placed = {}

        def rate(s: Stream) -> float:
            t = twin.get(s.id.split("/", 1)[1])
            return measured.get(t.id, s.rate_mbps) if t else s.rate_mbps

        for s in sorted(streams, key=rate, reverse=True):
            isp = self.isp_of(s.dst)
            choices = [p for p in uplinks if p.peer == isp]
            best = min(choices, key=lambda p: (load[p.name], p.name))
            load[best.name] += rate(s)
            placed[s.id] = best.name
            core_link = next(p for p in self.rports if p.node == CORE and p.peer == best.node)
            core_rules.append((s.tuple, core_link.intf, self.addr_of(best.node,
                                                                     core_link.peer_intf)))
            border_rules.setdefault(best.node, []).append(
                (s.tuple, best.intf, self.addr_of(best.peer, best.peer_intf)))
        self.pinned[CORE] = edgecontrol.pin(self.routers[CORE], core_rules)
        for border, rules in border_rules.items():
            self.pinned[border] = edgecontrol.pin(self.routers[border], rules)
        return placed

    def isp_of(self, host: str) -> str:
        for ln in self.desc["router_links"]:
            if ln["b"] == host:
                return ln["a"]
        raise KeyError(host)

    def addr_of(self, node: str, intf: str) -> str:
        r = next(x for x in self.desc["routers"] if x["name"] == node)
        return r["interfaces"][intf][0].split("/")[0]

    def run_phase(self, phase: str, index: int, measured: dict[str, float]) -> dict[str, Any]:
        duration = float(self.params["duration"])
        marks = [("start", time.monotonic())]
        config = self.configure(phase, measured)
        marks.append(("configure", time.monotonic()))
        streams = [s for s in self.streams if s.phase == phase]
        work = self.fabric.run_dir / "streams" / phase
        work.mkdir(parents=True, exist_ok=True)
        players = self.start_players(streams, work, duration)
        marks.append(("players", time.monotonic()))
        window = Window(self.sampler, self.fports, self.bridges, name=phase)
        before_r = routerstats.snapshot(self.pids, self.rports)
        nft0 = {n: routerstats.read_flow_counters(p, self.intfs[n]) for n, p in self.pids.items()}
        window.open()
        t_unix = time.time()
        senders = self.start_senders(streams, work, duration)
        self.progress(f"[{phase}] {len(streams)} streams for {duration:g} s "
                      f"(uplinks {config['uplink_bw_mbps']:g} Mbit/s)")
        events: dict[str, Any] = {}
        if phase.startswith("failover"):
            events = self.failover(phase, config, t_unix)
        with Ticker(duration, f"[{phase}] streaming"):
            for proc in senders + players:
                try:
                    proc.wait(timeout=duration + 30)
                except Exception:
                    proc.kill()
                    proc.wait()
        marks.append(("traffic", time.monotonic()))
        window.close()
        after_r = routerstats.snapshot(self.pids, self.rports)
        nft1 = {n: routerstats.read_flow_counters(p, self.intfs[n]) for n, p in self.pids.items()}
        t_start, t_end, measured_s = window.t_start, window.t_end, window.measured_s
        for s in streams:
            s.summary = self.read_stream(s, work)
        ovs = window.flow_deltas()
        nft = {n: routerstats.delta(nft1[n], nft0[n]) for n in nft1}
        links = window.links()
        links += metrics.router_link_entries(self.rports, self.rsampler.series, before_r,
                                             after_r, measured_s, t_start, config)
        flows = [self.flow_entry(s, ovs, nft) for s in streams]
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
                "flows": flows, "events": events, "cpu_idle_pct": judged["cpu_idle_pct"],
                "cpu_idle_min_pct": judged["cpu_idle_min_pct"],
                "lab_cpu_pct": judged["lab_cpu_pct"], "fidelity_window_s": judged["window_s"]}

    def probe(self, phase: str, flows: list[dict[str, Any]]) -> None:
        """TTL-limited probes with each origin stream's 5-tuple: which uplink does it hash to?

        The ISP answers from the address of the interface the probe arrived on
        (``icmp_errors_use_inbound_ifaddr``), which names the uplink; max TTL 3 (dccore,
        border, ISP) so no probe reaches the CDN node.
        """
        mine = [f for f in flows if f["role"] != "ingest"]
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

    # -- processes -----------------------------------------------------------------------------
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
                                        f"player {dst}"))
            ready.append(rf)
        # A player says it is ready by its file; one that died is reported at once.
        dead, waiting = programs.wait_ready(ready, procs, stop_at_death=True)
        if dead or waiting:
            raise MachineError("streams", f"players not ready "
                               f"({'exited' if dead else 'timed out'}): {dead or waiting}")
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
                                        work / f"{s.stream_id}.send.log", f"sender {s.id}"))
        # Every stream of the phase starts at once, when all are connected.
        programs.go([work / f"{s.stream_id}.send.ready" for s in streams], procs)
        return procs

    def host(self, name: str) -> Any:
        return self.fabric.host(name)

    def read_stream(self, s: Stream, work: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            play = json.loads((work / f"{s.dst}.play.json").read_text())
            out["player"] = next((x for x in play["streams"] if x["stream_id"] == s.stream_id),
                                 None)
        except (OSError, ValueError, KeyError):
            out["player"] = None
        try:
            out["sender"] = json.loads((work / f"{s.stream_id}.send.json").read_text())
        except (OSError, ValueError):
            out["sender"] = None
        return out

    # -- failover ------------------------------------------------------------------------------
    def failover(self, phase: str, config: dict[str, Any], t0_unix: float) -> dict[str, Any]:
        """Cut mid-phase, watch the routes go and come back; returns the times measured."""
        f = self.params["failover"]
        if phase == "failover-link":
            # The uplink carrying the most big streams, and the border whose route uses it.
            pred = config.get("predicted_uplink", {})
            counts: dict[str, int] = {}
            for sid, up in pred.items():
                if "/big" in sid:
                    counts[up] = counts.get(up, 0) + 1
            target = max(sorted(counts), key=lambda u: counts[u])
            port = next(p for p in self.rports if p.name == target)
            cuts = [(port.node, [port.intf]), (port.peer, [port.peer_intf])]
            watcher = (port.node, self.dst_prefix("cdn1"), port.intf)
            what = target
        else:
            border = "border1"
            mine = [p for p in self.rports if p.node == border]
            cuts = [(border, [p.intf for p in mine])]
            by_peer: dict[str, list[str]] = {}
            for p in mine:
                by_peer.setdefault(p.peer, []).append(p.peer_intf)
            cuts += list(by_peer.items())
            core_port = next(p for p in self.rports if p.node == CORE and p.peer == border)
            watcher = (CORE, self.dst_prefix("cdn1"), core_port.intf)
            what = border
        node, prefix, dev = watcher
        watch = RouteWatch(self.routers[node], prefix, dev)
        watch.start()
        time.sleep(max(0.0, t0_unix + f["cut_at"] - time.time()))
        t_cut = time.time()
        for name, intfs in cuts:
            edgecontrol.cut(self.routers[name], intfs)
        time.sleep(max(0.0, t0_unix + f["restore_at"] - time.time()))
        t_restore = time.time()
        for name, _ in cuts:
            edgecontrol.restore(self.routers[name])
        back_deadline = time.time() + 15
        while watch.back_at is None and time.time() < back_deadline:
            time.sleep(0.05)
        watch.stop()
        return {"cut": what, "watched_router": node, "watched_prefix": prefix,
                "watched_dev": dev, "cut_unix": t_cut, "restore_unix": t_restore,
                "phase_start_unix": t0_unix,
                "withdrawn_after_s": None if watch.gone_at is None
                else round(watch.gone_at - t_cut, 3),
                "returned_after_s": None if watch.back_at is None
                else round(watch.back_at - t_restore, 3)}

    def dst_prefix(self, host: str) -> str:
        ln = next(x for x in self.desc["router_links"] if x["b"] == host)
        return ln["subnet"]

    # -- result entries -----------------------------------------------------------------------
    def flow_entry(self, s: Stream, ovs: dict, nft: dict) -> dict[str, Any]:
        """``s``'s entry in result.json, its hops between routers from the routers' counters."""
        key = (s.src_ip, s.dst_ip, s.proto, s.sport, s.dport)
        start = CORE if s.role != "ingest" else self.isp_of(s.src)
        router_hops = metrics.router_path(self.intfs, self.port_at, key, start, nft)
        return metrics.flow_entry(s, ovs, self.att, self.adj, router_hops)


class RouteWatch(threading.Thread):
    """Polls a router's kernel route for ``prefix``: when ``dev`` leaves it and comes back."""

    def __init__(self, node: Any, prefix: str, dev: str, period_s: float = 0.01) -> None:
        super().__init__(daemon=True, name="fabriclab-route-watch")
        self.pid, self.prefix, self.dev, self.period = node.pid, prefix, dev, period_s
        self.gone_at: float | None = None
        self.back_at: float | None = None
        self._stop_evt = threading.Event()

    def run(self) -> None:
        while not self._stop_evt.wait(self.period):
            out = routerstats.ns_run(self.pid, ["ip", "-j", "route", "show", "exact",
                                                self.prefix], check=False).stdout
            try:
                routes = json.loads(out) if out.strip() else []
            except ValueError:
                continue
            devs = [nh.get("dev") for r in routes for nh in r.get("nexthops", [r])]
            now = time.time()
            if self.dev not in devs and self.gone_at is None:
                self.gone_at = now
            elif self.dev in devs and self.gone_at is not None and self.back_at is None:
                self.back_at = now

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=5)
