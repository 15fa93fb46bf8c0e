"""The RoCEv2 transport's CPU per Mbit/s (``lab/agents/roce``, the ``roce_bw`` program).

Why: every program the lab adds competes with the datapath for 2 cores, so the transport's
cost per Mbit/s bounds how much RoCE traffic a fidelity-valid run can carry. Both ends run
in two namespaces of this script's own joined by a bare veth (no shaping: the program's
pacer holds the rate), ``--cc none --qps 1 --size 65536`` for ``--seconds`` at each rate;
CPU is each end's getrusage (user + sys, from its JSON) over its elapsed time, per Mbit/s of
wire rate achieved. Only the sum of both ends means much: a veth delivers in the sender's
context, so the client's share includes the receiver's kernel work.

Usage: python bench/roce_cpu.py [--rates 50,100,200] [--seconds S] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controllers import cbuild  # noqa: E402
from lab.agents import roce  # noqa: E402


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=20)


def one_rate(program: Path, ns: tuple[str, str], ips: tuple[str, str], mbit: float,
             seconds: float, tmp: Path) -> dict:
    """Server in ns[1], client in ns[0] for ``seconds`` at ``mbit``: both JSONs' CPU."""
    srv_out, cli_out = tmp / f"srv-{mbit}.json", tmp / f"cli-{mbit}.json"
    enter = [["nsenter", f"--net=/run/netns/{n}"] for n in ns]
    server = subprocess.Popen([*enter[1], str(program), "--server", "--rate-mbps", str(mbit),
                               "--out", str(srv_out)], stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)
        client = subprocess.run([*enter[0], str(program), "--client", ips[1], "--cc", "none",
                                 "--qps", "1", "--size", "65536", "--duration", str(seconds),
                                 "--rate-mbps", str(mbit), "--out", str(cli_out)],
                                capture_output=True, text=True, timeout=seconds + 60)
        assert client.returncode == 0, client.stderr
    finally:
        os.kill(server.pid, signal.SIGTERM)     # by PID
        server.wait(timeout=10)
    cli, srv = (json.loads(p.read_text()) for p in (cli_out, srv_out))
    wire_mbps = cli["totals"]["wire_bytes_sent"] * 8 / cli["elapsed_s"] / 1e6
    cpu = {end: (j["cpu"]["user_s"] + j["cpu"]["sys_s"]) / j["elapsed_s"] * 100
           for end, j in (("client", cli), ("server", srv))}
    return {"rate_mbps": mbit, "wire_mbps": round(wire_mbps, 1),
            "client_cpu_pct": round(cpu["client"], 1), "server_cpu_pct": round(cpu["server"], 1),
            "cpu_pct_per_mbps": round((cpu["client"] + cpu["server"]) / wire_mbps, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="50,100,200")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    program = cbuild.build("roce_bw", roce.ROCE_BW)
    tag = os.getpid()
    ns, devs, ips = (f"rcb-{tag}-a", f"rcb-{tag}-b"), (f"rcb{tag}a", f"rcb{tag}b"), \
        ("10.81.0.1", "10.81.0.2")
    made: list[str] = []
    rows = []
    try:
        for n in ns:
            sh("ip", "netns", "add", n)
            made.append(n)
        sh("ip", "link", "add", devs[0], "netns", ns[0], "type", "veth", "peer", "name",
           devs[1], "netns", ns[1])
        for n, d, ip in zip(ns, devs, ips, strict=True):
            sh("ip", "-n", n, "addr", "add", f"{ip}/24", "dev", d)
            sh("ip", "-n", n, "link", "set", d, "up")
            sh("ip", "-n", n, "link", "set", "lo", "up")
        with tempfile.TemporaryDirectory() as tmp:
            for mbit in (float(r) for r in args.rates.split(",")):
                row = one_rate(program, ns, ips, mbit, args.seconds, Path(tmp))
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:    # deleting a namespace deletes its veth end
        for n in made:
            subprocess.run(["ip", "netns", "del", n], check=False)
    if args.json:
        Path(args.json).write_text(json.dumps({"rates": rows, "seconds": args.seconds},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
