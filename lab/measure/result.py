"""result.json's links and flows, built from counters only (the schema and its check are
``lab.model.result``)."""

from __future__ import annotations

from typing import Any

from lab.measure.telemetry import Port, PortSnapshot, Sampler
from lab.model.flowpaths import adjacency, attachment, path_from_counters
from lab.model.flows import FlowSpec


def link_entries(ports: list[Port], before: dict[Port, PortSnapshot],
                 after: dict[Port, PortSnapshot], sampler: Sampler,
                 duration_s: float, t_start: float) -> list[dict[str, Any]]:
    """One entry per switch egress port, counters as deltas over the traffic phase."""
    entries = []
    for p in ports:
        b, a = before[p], after[p]
        tx_bytes = a.tx_bytes - b.tx_bytes
        cap = p.bw_mbps * 1e6
        s = sampler.series[p]
        # Series restricted to the traffic phase, times relative to its start.
        idx = [i for i, t in enumerate(s.t) if t_start <= t <= t_start + duration_s + 0.05]
        t = [round(s.t[i] - t_start, 3) for i in idx]
        bps = [round(s.tx_bps[i]) for i in idx]
        entries.append({
            "node": p.node, "port": p.port, "peer": p.peer, "intf": p.intf,
            # A management LAN's port says so; the fabric's entries stay as they were.
            **({"role": p.role} if p.role != "fabric" else {}),
            "up": b.up and a.up, "bw_mbps": p.bw_mbps, "tx_bytes": tx_bytes,
            "tx_packets": a.tx_packets - b.tx_packets,
            "drops": (a.qdisc_drops - b.qdisc_drops) + (a.tx_dropped - b.tx_dropped),
            "util_mean": round(tx_bytes * 8 / duration_s / cap, 4) if duration_s else 0.0,
            "util_max": round(max(bps, default=0) / cap, 4),
            # Packets an ECN marker set CE on at this port (a kind with marking fills it in).
            "ce_marked": 0,
            "series": {"t": t, "tx_bps": bps,
                       "queue_bytes": [s.queue_bytes[i] for i in idx]},
        })
    return entries


def flow_entries(flows: list[FlowSpec], counters: dict[str, dict[int, tuple[int, int]]],
                 topo_desc: dict, indexes: list[int] | None = None) -> list[dict[str, Any]]:
    """Flows with the path their packets took, read from each switch's per-flow counters.

    ``counters`` is {switch: {cookie: (packets, bytes)}} as deltas over the traffic phase;
    ``indexes`` are the flows' counter indexes when they are not their list positions (a
    run whose phases each watch new flows).
    """
    adj = adjacency(topo_desc)
    att = attachment(topo_desc)
    entries = []
    for i, f in zip(indexes or range(len(flows)), flows, strict=True):
        fwd, rev = f.watch_entries(i)
        hops = {sw: c.get(fwd["cookie"], (0, 0))[1] for sw, c in counters.items()}
        rhops = {sw: c.get(rev["cookie"], (0, 0))[1] for sw, c in counters.items()}
        path, clean = path_from_counters(hops, att[f.src], adj)
        rpath, rclean = path_from_counters(rhops, att[f.dst], adj)
        first = hops.get(path[0], 0) if path else 0
        last = hops.get(path[-1], 0) if path else 0
        r = f.result
        entries.append({
            "id": f.id, "kind": f.kind, "src": f.src, "dst": f.dst,
            "src_ip": f.src_ip, "dst_ip": f.dst_ip, "proto": f.proto,
            "sport": f.sport, "dport": f.dport, "path": path, "path_clean": clean,
            "bytes": first,
            "hop_bytes": {sw: hops[sw] for sw in path},
            "reverse_path": rpath, "reverse_path_clean": rclean,
            "reverse_hop_bytes": {sw: rhops[sw] for sw in rpath},
            "offered_bps": f.rate_bps,
            "goodput_bps": r.get("goodput_bps", 0.0),
            # Fabric loss: bytes that entered the first switch but never reached the last.
            "loss": round(max(0.0, 1 - last / first), 5) if first else 0.0,
            "retransmits": r.get("retransmits", 0),
            "sent_bytes": r.get("sent_bytes", 0),
            "received_bytes": r.get("received_bytes", 0),
            **({"receiver_cpu_pct": r["receiver_cpu_pct"]} if "receiver_cpu_pct" in r else {}),
            "cc": f.cc if f.proto == "tcp" else None,
            "error": r.get("error"),
            # An MPTCP connection's entry (its first subflow) says how many it has; a
            # subflow's entry (an MPTCP subflow, a sprayed QP's other source ports) names
            # its flow, whose goodput it is part of.
            **({"transport": "mptcp", "subflows": f.subflows} if f.subflows > 1 else {}),
            **({"subflow_of": f.subflow_of} if f.subflow_of else {}),
        })
    return entries
