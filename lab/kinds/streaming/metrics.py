"""What the streaming kind's result.json says: each stream's and router port's entry from the
counters, each phase's summary, the kind's part of the result, the lines ``fabriclab run``
prints and what ``fabriclab regress`` holds a policy to."""

from __future__ import annotations

from typing import Any

from lab.kinds.base import PhaseCounts, Plan, phased_part
from lab.kinds.streaming.plan import Stream
from lab.measure import headroom
from lab.measure.routerstats import RouterPort, Series
from lab.model.flowpaths import path_from_counters
from lab.net.edge import CORE


# -- result entries ---------------------------------------------------------------------------
def router_link_entries(rports: list[RouterPort], series: dict[RouterPort, Series],
                        before: dict, after: dict, duration_s: float, t_start: float,
                        config: dict[str, Any]) -> list[dict[str, Any]]:
    """The routers' ports as ``links`` entries: counters ``before`` and ``after`` the
    measurement window, rates from the router sampler's ``series``."""
    entries = []
    for p in rports:
        b, a = before[p], after[p]
        bw = config["uplink_bw_mbps"] if p.role == "uplink" else p.bw_mbps
        tx = a.tx_bytes - b.tx_bytes
        s = series[p]
        idx = [i for i, t in enumerate(s.t) if t_start <= t <= t_start + duration_s + 0.05]
        bps = [round(s.tx_bps[i]) for i in idx]
        entries.append({
            "name": p.name, "node": p.node, "port": p.port, "peer": p.peer,
            "intf": p.intf, "peer_intf": p.peer_intf, "role": p.role, "up": True,
            "bw_mbps": bw, "tx_bytes": tx, "tx_packets": a.tx_packets - b.tx_packets,
            "drops": a.drops - b.drops,
            "util_mean": round(tx * 8 / duration_s / (bw * 1e6), 4),
            "util_max": round(max(bps, default=0) / (bw * 1e6), 4),
            "ce_marked": 0,          # the routers' queues do not mark
            "series": {"t": [round(s.t[i] - t_start, 3) for i in idx], "tx_bps": bps}})
    return entries


#: A relay's entry keys that only a viewer could fill.
RELAY_UNVIEWED = ("goodput_bps", "stalls", "stall_s", "frames_expected", "frames_lost",
                  "lost_pct", "jitter_ms", "max_gap_s", "max_gap_start_unix", "end_reason",
                  "received", "players", "playout")


def flow_entry(s: Stream, ovs: dict, att: dict[str, str], adj: dict[str, dict[str, int]],
               router_hops: list[dict[str, Any]],
               reverse_hops: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A stream's ``flows`` entry: its path through the fabric from the OVS counters ``ovs``
    (``att`` and ``adj`` as ``lab.model.flowpaths`` makes them), its ``router_hops``
    (``router_path``) and those of its packets the other way (``reverse_hops``: ACKs), and
    what its sender and player reported."""
    spec = s.spec()
    fwd, rev = spec.watch_entries(s.index)
    hops = {sw: c.get(fwd["cookie"], (0, 0))[1] for sw, c in ovs.items()}
    rhops = {sw: c.get(rev["cookie"], (0, 0))[1] for sw, c in ovs.items()}
    path, clean = path_from_counters(hops, att.get(s.src, att[CORE]), adj)
    rpath, _ = path_from_counters(rhops, att.get(s.dst, att[CORE]), adj)
    player = s.summary.get("player") or {}
    sender = s.summary.get("sender") or {}
    first_bytes = hops.get(path[0], 0) if path else 0
    nodes: list[str] = []
    for h in router_hops:
        nodes += [n for n in (h["from"], h["to"]) if n not in nodes]
    entry = {
        "id": s.id, "kind": "stream", "role": s.role, "phase": s.phase, "src": s.src,
        "dst": s.dst, "src_ip": s.src_ip, "dst_ip": s.dst_ip, "proto": s.proto,
        "sport": s.sport, "dport": s.dport, "offered_bps": s.rate_mbps * 1e6,
        "path": path, "path_clean": clean, "hop_bytes": {sw: hops[sw] for sw in path},
        "reverse_path": rpath, "reverse_hop_bytes": {sw: rhops[sw] for sw in rpath},
        "router_hops": router_hops, "reverse_router_hops": reverse_hops or [],
        # Every node in travel order: the fabric's switches, then the routers (or the
        # other way round for an anchor's push into the DC).
        "full_path": path + nodes if s.role != "ingest" else nodes + path,
        "uplinks": [h["link"] for h in router_hops if h["role"] == "uplink"],
        "bytes": first_bytes or (router_hops[0]["sent"] if router_hops else 0),
        "goodput_bps": player.get("goodput_bps", 0.0),
        "loss": round(sum(h["lost"] for h in router_hops)
                      / max(1, router_hops[0]["sent"]), 5) if router_hops else 0.0,
        "retransmits": ((sender.get("tcp") or {}).get("total_retrans", 0)),
        "stalls": player.get("stalls", 0), "stall_s": player.get("stall_s", 0.0),
        "frames_expected": player.get("frames_expected", 0),
        "frames_lost": player.get("frames_lost", 0),
        "lost_pct": player.get("lost_pct", 100.0 if not player else 0.0),
        "jitter_ms": player.get("jitter_ms"), "max_gap_s": player.get("max_gap_s"),
        "max_gap_start_unix": player.get("max_gap_start_unix"),
        "end_reason": player.get("end_reason"), "received": bool(player),
        # Real media: every real player of the stream (RTMP, HLS, hls.js in a browser).
        "players": s.summary.get("players"),
        # The player's timeline, so a report can draw when each stall happened.
        # A real viewer's times count from when it joined (``join_unix``), before its first
        # frame; a synthetic player's from its first frame.
        "playout": {k: player.get(k) for k in ("first_arrival_unix", "join_unix",
                                                "startup_delay_s", "play_end_s",
                                                "stall_events")},
    }
    if s.relayed_by is not None:
        entry["relayed_by"] = s.relayed_by
    if s.relay_of is not None:
        # No viewer of its own: what it delivered is watched at the end of the stream it
        # feeds (``relay_of``), so nothing here is a viewer's.
        entry["relay_of"] = s.relay_of
        entry.update({k: None for k in RELAY_UNVIEWED})
    return entry


def viewed(flows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The flows a viewer watched: all but the relays."""
    return [f for f in flows if f.get("role") != "relay"]


def router_path(intfs: dict[str, list[str]], port_at: dict[tuple[str, str], RouterPort],
                key: tuple, start: str, nft: dict) -> list[dict[str, Any]]:
    """The links the flow crossed between routers, from the routers' own counters.

    Every link a router sent the flow out of is listed (more than one per router after
    a failover); ``sent`` is what the sending router counted leaving, ``arrived`` what
    the far router counted coming in, ``lost`` the difference. ``intfs``: every router's
    interfaces; ``port_at``: the router port at (router, interface).
    """
    routers = set(intfs)
    out = []
    todo, seen = [start], set()
    while todo:
        node = todo.pop(0)
        if node in seen:
            continue
        seen.add(node)
        for intf in intfs[node]:
            sent = nft[node].get((intf, "out"), {}).get(key, 0)
            if sent <= 0:
                continue
            port = port_at.get((node, intf))
            if port is None:
                continue          # the fabric side: counted by OVS
            peer, pintf, role = port.peer, port.peer_intf, port.role
            arrived = nft[peer].get((pintf, "in"), {}).get(key, 0) if peer in routers \
                else None
            out.append({"link": f"{intf}->{pintf}", "from": node, "to": peer,
                        "role": role, "sent": sent, "arrived": arrived,
                        "lost": max(0, sent - arrived) if arrived is not None else 0})
            if peer in routers:
                todo.append(peer)
    return out


# -- phases and the result --------------------------------------------------------------------
def fidelity_span(senders: list[tuple[float, float]], t_start: float, t_end: float,
                  duration: float) -> tuple[float, float]:
    """The seconds a phase's CPU is judged over, on the sampler's clock: while every stream
    sends, from the last sender's first frame to the first sender's last.

    ``senders``: (first frame, seconds sending) of each sender. Starting a dozen Python
    senders and players is the lab's set-up, and the exit of those whose stream ended
    (summaries, interpreter teardown) its teardown: in a TCG guest the six that finished
    first took both vCPUs for two seconds while four backlogged streams drained at a few
    Mbit/s. A stream cut short to under half the phase (a sender that failed) does not
    shorten the judged seconds; without senders the whole counter window is judged.
    """
    if not senders:
        return t_start, t_end
    t_fid = min(max(t_start, *(t0 for t0, _ in senders)), t_end)
    ends = [t0 + elapsed for t0, elapsed in senders]
    full = [e for e in ends if e - t_fid >= duration / 2]
    return t_fid, min(max(t_fid, min(full) if full else max(ends)), t_end)


def wan_fidelity(asked_ms: float, got: dict[str, float | None]
                 ) -> tuple[dict[str, Any], str | None]:
    """``fidelity`` entries for the uplinks' WAN delay, and a note when it is not what was
    asked: ``wan_delay`` is ``netem`` only when every uplink's root netem has the delay."""
    values = sorted({v for v in got.values() if v is not None})
    entries: dict[str, Any] = {"wan_delay_ms_asked": asked_ms, "wan_delay_ms": values}
    if asked_ms and got and all(v is not None and abs(v - asked_ms) < 1e-3 for v in got.values()):
        return {"wan_delay": "netem", **entries}, None
    if not asked_ms:
        return {"wan_delay": "none (not asked)", **entries}, None
    if not any(v is not None for v in got.values()):
        return ({"wan_delay": "none (no netem)", **entries},
                f"no netem: the ISPs' WAN links have no delay ({asked_ms:g} ms asked)")
    wrong = sorted(k for k, v in got.items() if v is None or abs(v - asked_ms) >= 1e-3)
    return ({"wan_delay": "partial", **entries},
            f"WAN delay {asked_ms:g} ms asked, but {', '.join(wrong)} read back otherwise")


def phase_metrics(ph: dict[str, Any]) -> dict[str, Any]:
    """A phase's summary (frames lost, stalls, the hottest uplink), plus what explains it.

    Its streams are those a viewer watched; the relays feeding them (real media) are summed
    apart (``relays``), so a relay is neither a stream nor a missing viewer."""
    flows = viewed(ph["flows"])
    relays = [f for f in ph["flows"] if f.get("role") == "relay"]
    uplinks = {ln["name"]: ln for ln in ph["links"] if ln.get("role") == "uplink"
               and ln["node"].startswith("border")}
    expected = sum(f["frames_expected"] for f in flows)
    lost = sum(f["frames_lost"] for f in flows)
    hot = max(uplinks.values(), key=lambda ln: ln["util_mean"], default=None)
    cap = sum(ln["bw_mbps"] * 1e6 for ln in uplinks.values())
    used = sum(ln["tx_bytes"] * 8 / ph["duration_s"] for ln in uplinks.values())
    out = {
        "stalls": sum(f["stalls"] for f in flows),
        "stall_s": round(sum(f["stall_s"] for f in flows), 3),
        "uplinks": {n: ln["util_mean"] for n, ln in uplinks.items()},
        "uplink_drops": {n: ln["drops"] for n, ln in uplinks.items()},
        "streams_lost_pct": round(100 * lost / expected, 3) if expected else 0.0,
        "fidelity_valid": headroom.cpu_verdict(ph) is None
        and all(f["received"] for f in flows),
        **headroom.cpu_fields(ph),
        "fidelity_window_s": ph.get("fidelity_window_s"),
        "hottest_uplink": hot["name"] if hot else None,
        "hottest_util": hot["util_mean"] if hot else 0.0,
        "uplinks_idle": sorted(n for n, ln in uplinks.items() if ln["util_mean"] < 0.05),
        "capacity_used": round(used / cap, 4) if cap else 0.0,
        "offered_mbps": round(sum(f["offered_bps"] for f in flows) / 1e6, 3),
        "streams": len(flows),
        "stalled_streams": sorted(f["id"] for f in flows if f["stalls"] > 0),
        "retransmits": sum(f["retransmits"] for f in flows),
        "config": ph["config"],
    }
    if ph["events"].get("cut"):
        ev = ph["events"]
        crossing = [f for f in flows if any(ev["cut"] in (h["link"], h["from"], h["to"])
                                           for h in f["router_hops"])]
        out["failover"] = {
            **{k: v for k, v in ev.items() if not k.endswith("_unix")},
            "streams_on_cut": sorted(f["id"] for f in crossing),
            "outage_s": {f["id"]: round(f["max_gap_s"] or 0.0, 3) for f in crossing},
            # A stream whose player had no frame yet when the cut came could not see it:
            # its outage above says nothing about the cut.
            "unwatched_at_cut": sorted(
                f["id"] for f in crossing
                if (f.get("playout") or {}).get("first_arrival_unix") is None
                or f["playout"]["first_arrival_unix"] > ev["cut_unix"]),
            # Silently lost: the player never saw it, or it ended without its sender's
            # clean close (TCP) / end marker (UDP), or frames went missing unaccounted.
            # A real viewer watches to the end of its time ("duration").
            "streams_lost": sorted(f["id"] for f in flows if not f["received"]
                                   or f["end_reason"] not in ("eof", "end-marker",
                                                              "duration")),
        }
    if any(f.get("players") for f in flows):
        out["players"] = players_summary(flows)
    if relays:
        out["relays"] = {"streams": len(relays), "bytes": sum(f["bytes"] for f in relays),
                         "retransmits": sum(f["retransmits"] for f in relays)}
    return out


#: How far the lab's HLS viewer's stall count may be from hls.js's on the same stream.
#: The browser resumes as soon as a segment is appended; the lab's rule (ExoPlayer's) waits
#: for 2 s of buffer, so one of its stalls can be two short ones in the browser.
BROWSER_STALL_TOLERANCE = 1


def players_summary(flows: list[dict[str, Any]]) -> dict[str, Any]:
    """Real media: every kind of player's stalls in the phase, side by side, and the check
    of the lab's players against a real browser's (hls.js) on the stream it also played."""
    out: dict[str, Any] = {}
    for what in ("rtmp", "hls", "hlsjs"):
        got = [p[what] for f in flows if (p := f.get("players") or {}).get(what)]
        if got:
            out[what] = {"viewers": len(got), "stalls": sum(p.get("stalls", 0) for p in got),
                         "stall_s": round(sum(p.get("stall_s", 0.0) for p in got), 3)}
    checks = []
    for f in flows:
        p = f.get("players") or {}
        if p.get("hls") and p.get("hlsjs"):
            diff = abs(p["hls"].get("stalls", 0) - p["hlsjs"].get("stalls", 0))
            checks.append({"stream": f["id"], "hls_stalls": p["hls"].get("stalls", 0),
                           "hlsjs_stalls": p["hlsjs"].get("stalls", 0),
                           "rtmp_stalls": (p.get("rtmp") or {}).get("stalls", 0),
                           "agree": diff <= BROWSER_STALL_TOLERANCE})
    out["browser_check"] = {"tolerance": BROWSER_STALL_TOLERANCE, "streams": checks}
    return out


def phase_line(mt: dict[str, Any]) -> str:
    return (f"stalls {mt['stalls']} ({mt['stall_s']:.1f} s), lost {mt['streams_lost_pct']:.2f}%, "
            f"hottest uplink {mt['hottest_uplink']} {mt['hottest_util'] * 100:.0f}% "
            f"({mt['uplink_drops'].get(mt['hottest_uplink'], 0)} drops), "
            f"{len(mt['uplinks_idle'])} of {len(mt['uplinks'])} uplinks idle")


def assemble(plan: Plan, phases: dict[str, Any], bgp: dict[str, Any],
             bgp_after: dict[str, Any], wan: dict[str, float | None]) -> dict[str, Any]:
    """The kind's part of result.json (``lab.kinds.base.phased_part``): top-level links
    and flows are the incident's (what diagnose explains); every phase's own are under
    ``phase_details``; the WAN delay the uplinks got joins the fidelity."""
    metrics: dict[str, Any] = {"phases": {n: phase_metrics(p) for n, p in phases.items()},
                               "bgp": bgp, "bgp_after": bgp_after}
    counts = {n: PhaseCounts(duration_s=p["duration_s"], links=p["links"], flows=p["flows"],
                             cpu_idle_min_pct=p["cpu_idle_min_pct"],
                             lab_cpu_pct=p["lab_cpu_pct"],
                             valid=metrics["phases"][n]["fidelity_valid"], details=p,
                             cpu=headroom.cpu_fields(p))
              for n, p in phases.items()}
    wan_fields, wan_note = wan_fidelity(float(plan.topo_desc["params"].get("wan_delay_ms", 0)),
                                        wan)
    return phased_part(plan, counts, "incident" if "incident" in phases else next(iter(phases)),
                       metrics, notes=[wan_note] if wan_note else [], fidelity=wan_fields)


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [(name, phase_line(mt)) for name, mt in result["metrics"]["phases"].items()]


def regress_metrics(result: dict[str, Any]) -> dict[str, float]:
    """Per phase: viewers' stalls and drops at the uplinks."""
    out = {}
    for name, mt in result["metrics"]["phases"].items():
        out[f"{name}.stalls"] = float(mt["stalls"])
        out[f"{name}.drops"] = float(sum(mt.get("uplink_drops", {}).values()))
    return out
