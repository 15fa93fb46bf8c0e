"""Traceroute with a flow's own 5-tuple: which equal-cost link does *this* stream take?

Routers hash the 5-tuple (or just the addresses) to pick one of several equal-cost next
hops, so an ordinary traceroute - with its own ports - may walk a different link than the
stream it is meant to explain. These probes carry the stream's exact protocol, addresses and
ports with a growing TTL; each router on the path answers ICMP time-exceeded from the
address of the interface the probe arrived on, which names the link the stream hashes to.
It is how an operator checks a path on a real network, and the lab checks it against the
links' own byte counters.

Run inside a host's namespace (it needs raw sockets there):
``python -m lab.agents.probe --proto tcp --src IP --dst IP --sport N --dport N [--max-ttl 8]``
prints JSON: ``{"hops": [{"ttl": 1, "from": "10.1.0.2", "rtt_ms": 0.4}, ...]}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

ICMP_TIME_EXCEEDED = 11
ICMP_DEST_UNREACH = 3


def probe_packets(proto: str, src: str, dst: str, sport: int, dport: int,
                  max_ttl: int) -> list[Any]:
    """One probe per TTL. TCP probes are bare ACKs: no connection is opened or reset."""
    from scapy.layers.inet import IP, TCP, UDP
    l4 = TCP(sport=sport, dport=dport, flags="A", seq=0, ack=0) if proto == "tcp" \
        else UDP(sport=sport, dport=dport)
    return [IP(src=src, dst=dst, ttl=ttl, id=0xFA00 + ttl) / l4 for ttl in
            range(1, max_ttl + 1)]


def trace(proto: str, src: str, dst: str, sport: int, dport: int, max_ttl: int = 8,
          timeout_s: float = 1.0) -> list[dict[str, Any]]:
    """Send the probes, return the hops that answered, in TTL order."""
    return trace_many([(proto, src, dst, sport, dport)], max_ttl, timeout_s)[0]


def trace_many(flows: list[tuple[str, str, str, int, int]], max_ttl: int = 8,
               timeout_s: float = 1.0) -> list[list[dict[str, Any]]]:
    """Probe several 5-tuples at once (one scapy start, one wait): hops per flow."""
    from scapy.config import conf
    from scapy.layers.inet import IP
    from scapy.sendrecv import sr
    conf.verb = 0
    _seed_arp_cache(conf)
    packets = []
    for i, (proto, src, dst, sport, dport) in enumerate(flows):
        for pkt in probe_packets(proto, src, dst, sport, dport, max_ttl):
            pkt[IP].id = (i << 6) | pkt[IP].ttl       # which flow and TTL, for the reply
            packets.append(pkt)
    answered, _ = sr(packets, timeout=timeout_s, verbose=0)
    per_flow: list[list[Any]] = [[] for _ in flows]
    for sent, reply in answered:
        per_flow[sent[IP].id >> 6].append((sent, reply))
    return [_hops(pairs, flows[i][2]) for i, pairs in enumerate(per_flow)]


def _seed_arp_cache(conf: Any) -> None:
    """Give scapy the kernel's neighbour entries: it resolves next hops with ARP requests of
    its own, which a fabric whose controller answers no ARP (static entries) never answers."""
    import subprocess
    out = subprocess.run(["ip", "-j", "neigh", "show"], capture_output=True, text=True)
    try:
        entries = json.loads(out.stdout or "[]")
    except ValueError:
        return
    for e in entries:
        if e.get("lladdr") and e.get("dst"):
            conf.netcache.arp_cache[e["dst"]] = e["lladdr"]


def _hops(answered: list[Any], dst: str) -> list[dict[str, Any]]:
    from scapy.layers.inet import ICMP, IP
    hops = []
    for sent, reply in answered:
        hop = {"ttl": sent[IP].ttl, "from": reply[IP].src,
               "rtt_ms": round((reply.time - sent.sent_time) * 1000, 3)}
        if reply.haslayer(ICMP):
            hop["icmp_type"] = int(reply[ICMP].type)
        hops.append(hop)
    hops.sort(key=lambda h: h["ttl"])
    # Beyond the destination every TTL gets the same answer; keep the first only.
    out = []
    for hop in hops:
        out.append(hop)
        if hop["from"] == dst or hop.get("icmp_type") not in (ICMP_TIME_EXCEEDED, None):
            break
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.agents.probe",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--proto", choices=("tcp", "udp"), default="tcp")
    ap.add_argument("--src")
    ap.add_argument("--dst")
    ap.add_argument("--sport", type=int)
    ap.add_argument("--dport", type=int)
    ap.add_argument("--flows", help='JSON list of [proto, src, dst, sport, dport]: probe '
                    'them all at once; prints {"flows": [hops, ...]}')
    ap.add_argument("--max-ttl", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=1.0)
    args = ap.parse_args(argv)
    if args.flows:
        flows = [tuple(f) for f in json.loads(args.flows)]
        print(json.dumps({"flows": trace_many(flows, args.max_ttl, args.timeout)}))
        return 0
    if None in (args.src, args.dst, args.sport, args.dport):
        ap.error("--src, --dst, --sport and --dport are required without --flows")
    hops = trace(args.proto, args.src, args.dst, args.sport, args.dport, args.max_ttl,
                 args.timeout)
    print(json.dumps({"hops": hops}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
