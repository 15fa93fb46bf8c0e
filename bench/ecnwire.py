"""How fast ``lab.measure.ecnwire.summarize`` reads a capture, in packets/s.

A capture of ``--n`` packets (an ECN TCP connection's handshake and data, repeated, as
tests/unit/test_ecnwire.py writes it) read overall and with one flow to report on; median,
least and most of ``--runs``. For scale, scapy's own dissection (``PcapReader``, a full Packet
per record: what summarize does not use) of the first ``--scapy-n`` packets of the same file.

Target: >= 100k packets/s with a flow, so that a run's capture of tens of MB (a 10 s run at
100 Mbit/s is ~80k full-size packets) is read in about a second, not minutes; the raw reader
was written to replace scapy's dissection, which read 50k packets in 6.7 s on the CI machine.

Usage: python bench/ecnwire.py [--n N] [--runs R] [--scapy-n M] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import PcapReader, PcapWriter

from lab.measure import ecnwire

TARGET_PKTS_S = 100_000.0
A, B = "10.0.0.1", "10.0.0.2"
ECT0, CE = 2, 3
FLOW = {"src_ip": A, "dst_ip": B, "proto": "tcp", "sport": 40000, "dport": 5201}


def tcp(src: str, dst: str, sport: int, dport: int, flags: str, tos: int = 0,
        payload: int = 0) -> bytes:
    return bytes(Ether() / IP(src=src, dst=dst, tos=tos)
                 / TCP(sport=sport, dport=dport, flags=flags) / Raw(bytes(payload)))


#: One connection's packets in both directions, as a receiver's capture shows them.
CYCLE = [
    tcp(A, B, 40000, 5201, "SEC"), tcp(B, A, 5201, 40000, "SAE"), tcp(A, B, 40000, 5201, "A"),
    tcp(A, B, 40000, 5201, "PA", ECT0, 1000), tcp(A, B, 40000, 5201, "PA", CE, 1000),
    tcp(A, B, 40000, 5201, "PA", CE, 1000), tcp(B, A, 5201, 40000, "AE"),
    tcp(B, A, 5201, 40000, "AE"), tcp(A, B, 40000, 5201, "PAC", ECT0, 1000),
    tcp(B, A, 5201, 40000, "A"),
]


def write_capture(path: Path, n: int) -> None:
    with PcapWriter(str(path), linktype=1) as w:
        for i in range(n):
            w.write(CYCLE[i % len(CYCLE)])


def rate(path: Path, n: int, flows: list[dict] | None) -> float:
    t0 = time.perf_counter()
    s = ecnwire.summarize(path, flows)
    took = time.perf_counter() - t0
    if s["ipv4"] != n:
        raise SystemExit(f"summarize counted {s['ipv4']} packets of {n}")
    return n / took


def scapy_rate(path: Path, n: int) -> float:
    t0 = time.perf_counter()
    with PcapReader(str(path)) as reader:
        for i, _ in enumerate(reader, 1):
            if i == n:
                break
    return n / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50_000, help="packets in the capture")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--scapy-n", type=int, default=5_000,
                    help="packets scapy dissects for comparison (0: skip)")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.pcap"
        write_capture(path, args.n)
        size = path.stat().st_size
        for label, flows in (("overall", None), ("one flow", [FLOW])):
            rates = [rate(path, args.n, flows) for _ in range(args.runs)]
            rows.append({"mode": label, "median_pkts_s": round(statistics.median(rates)),
                         "min_pkts_s": round(min(rates)), "max_pkts_s": round(max(rates)),
                         "runs": [round(r) for r in rates]})
        scapy = scapy_rate(path, min(args.scapy_n, args.n)) if args.scapy_n > 0 else None
    with_flow = rows[-1]["median_pkts_s"]
    verdict = "ok" if with_flow >= TARGET_PKTS_S else "MISSED"
    print(f"{'mode':<9}  {'median pkts/s':>13}  {'least':>9}  {'most':>9}")
    for r in rows:
        print(f"{r['mode']:<9}  {r['median_pkts_s']:>13,}  {r['min_pkts_s']:>9,}  "
              f"{r['max_pkts_s']:>9,}")
    print(f"target {TARGET_PKTS_S / 1e3:g}k pkts/s with a flow: {verdict}")
    if scapy is not None:
        print(f"scapy PcapReader: {scapy:,.0f} pkts/s (summarize with a flow: "
              f"{with_flow / scapy:.0f}x that)")
    print(f"({args.n} packets, {size / 1e6:.1f} MB, median of {args.runs}; "
          f"{os.cpu_count()} CPUs; Python {sys.version.split()[0]})")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"rows": rows, "n": args.n, "runs": args.runs, "bytes": size,
             "target_pkts_s": TARGET_PKTS_S, "verdict": verdict,
             "scapy_pkts_s": None if scapy is None else round(scapy),
             "cpus": os.cpu_count()}, indent=1))
    return 0 if verdict == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
