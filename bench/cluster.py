"""One fabric on one machine and on two: what splitting costs, and how far N machines go.

Two parts:

``--measure`` (needs ``fabriclab vm cluster up``; QEMU, root): on the two VM-lane guests,

* a gretap tunnel against a veth, each between two namespaces of the guests: ping RTT
  (median of 20) and one iperf3 TCP flow for 5 s;
* ``ecmp-basic`` (hash5, seed 3, 5 s) on the head alone and split over both guests:
  bring-up, goodput, each worker's least idle second and the lab's own CPU there.

Under TCG the two guests share this machine's two cores, so this part measures overhead and
correctness, not capacity: every run is CPU-bound (0 % idle) and says so.

``--estimate`` (no root): how many machines a fat-tree needs, from the capacity model
(``lab.model.capacity``: the userspace datapath's measured budget per core, at the fidelity
line) and the partition plan (``lab.analysis.partition``: the tunnels' traffic per worker).
N machines of C cores each hold a plan when

    load(plan, N*C cores) <= 1   and   every worker's tunnel Mbit/s <= its NIC rate;

the estimate gives the fewest N for the first, and the NIC rate that N needs for the second
(the partition's cut at full load: every cut link at its rate, each way: a worst case).
where load = flow_hops*cost/(FLOW_HOPS_PER_CORE*N*C) + pkt_hops/(PKT_HOPS_PER_CORE*N*C).
Assumed: every machine is like the CI machine per core (the budgets are per core and were
measured on 2), the budget adds up across machines (each ``ovs-vswitchd`` forwards only its
own switches' packets), tunnel encapsulation costs nothing extra, and the plan is
``ecmp-polarisation`` with one flow per host at the scenario's load.

Usage: python bench/cluster.py [--estimate] [--measure] [--cores 2] [--nic-mbps 1000]
       [--json bench/out/cluster.json]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from controllers import policies  # noqa: E402
from lab.analysis.partition import partition  # noqa: E402
from lab.model import capacity  # noqa: E402

OUT = REPO / "bench" / "out"
CLI = [sys.executable, "-m", "lab.cli"]
#: The fabrics the estimate is for: (k, link Mbit/s).
FABRICS = ((8, 100.0), (12, 100.0))


def estimate(cores: int, nic_mbps: float, max_machines: int = 256) -> list[dict[str, Any]]:
    """Per fabric, the fewest machines whose datapath budget and NICs hold it."""
    from lab import kinds
    from lab.model import scenario
    from lab.net.topologies import describe, make_topology
    sc = scenario.load("ecmp-polarisation")
    kind = kinds.get(sc.kind)
    rows = []
    for k, rate in FABRICS:
        hosts = k ** 3 // 4
        params = scenario.apply_sets(sc.params, scenario.parse_set([
            f"topology.k={k}", f"topology.host_bw={rate:g}", f"topology.fabric_bw={rate:g}",
            f"traffic.flows={min(hosts, 128)}"]), kind.schema)
        # Beyond one machine's limits on purpose: the question is how many machines.
        desc = describe(make_topology(params["topology"], machine_limits=False))
        flows = kind.plan(desc, params, random.Random(1))
        gran = policies.resolve("hash5").granularity
        row: dict[str, Any] = {"k": k, "link_mbps": rate, "hosts": hosts,
                               "switches": len(desc["switches"]),
                               "flows": len(flows), "cores_per_machine": cores,
                               "nic_mbps": nic_mbps}
        for n in range(1, max_machines + 1):
            exp = capacity.expect(desc, {"": flows}, gran, "user", n * cores, 1.0)
            tunnel = max((w.tunnel_mbps for w in partition(desc, n).workers),
                         default=0.0) if n > 1 else 0.0
            if exp.load <= 1:
                row.update(machines=n, load=exp.load, tunnel_mbps_per_worker=tunnel,
                           nic_holds=tunnel <= nic_mbps)
                break
        else:
            row.update(machines=None, why=f"more than {max_machines}")
        rows.append(row)
    return rows


def _head(line: str, worker: int = 1, timeout: float = 1800) -> str:
    out = subprocess.run([*CLI, "vm", "cluster", "exec", "--worker", str(worker), "--",
                          "bash", "-c", line], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f"w{worker}: {line!r} failed: {out.stderr[-500:]}")
    return out.stdout


def _link_probe(kind: str) -> dict[str, Any]:
    """Two namespaces joined by a veth on the head, or by a gretap across the two guests;
    ping and one iperf3 flow between them (the bench's own probe: nothing of the lab)."""
    setup_veth = ("ip netns add ba; ip netns add bb; ip link add va netns ba type veth peer "
                  "name vb netns bb; ip -n ba addr add 10.9.0.1/24 dev va; ip -n bb addr add "
                  "10.9.0.2/24 dev vb; ip -n ba link set va up; ip -n bb link set vb up")
    if kind == "veth":
        _head(setup_veth)
        client, server = 1, 1
    else:
        for w, (me, peer, ip) in ((1, ("192.168.77.1", "192.168.77.2", "10.9.0.1")),
                                  (2, ("192.168.77.2", "192.168.77.1", "10.9.0.2"))):
            ns = "ba" if w == 1 else "bb"
            _head(f"ip netns add {ns}; ip link add gb type gretap local {me} remote {peer} "
                  f"key 99 ttl 64; ip link set gb mtu 1500 netns {ns}; ip -n {ns} addr add "
                  f"{ip}/24 dev gb; ip -n {ns} link set gb up", w)
        client, server = 1, 2
    try:
        _head("ip netns exec bb iperf3 -s -1 -D -B 10.9.0.2", server)
        time.sleep(1)
        ping = _head("ip netns exec ba ping -c 20 -i 0.2 -q 10.9.0.2", client)
        rtts = [float(x) for x in ping.rsplit("=", 1)[1].split()[0].split("/")[:2]]
        perf = json.loads(_head("ip netns exec ba iperf3 -c 10.9.0.2 -t 5 -J", client))
        mbps = perf["end"]["sum_received"]["bits_per_second"] / 1e6
        return {"link": kind, "rtt_min_ms": rtts[0], "rtt_avg_ms": rtts[1],
                "tcp_mbps": round(mbps, 1)}
    finally:
        for w in {client, server}:
            _head("ip netns del ba 2>/dev/null; ip netns del bb 2>/dev/null; true", w)


def _run(split: bool) -> dict[str, Any]:
    out = f"/root/bench-{'split' if split else 'one'}"
    _head(f"fabriclab run ecmp-basic --policy hash5 --seed 3 --duration 5 --out {out} "
          + ("--cluster /etc/fabriclab/cluster.yaml" if split else ""))
    r = json.loads(_head(f"cat {out}/result.json"))
    row = {"machines": 2 if split else 1, "ready_s": r["timings"]["ready_s"],
           "wall_s": r["timings"]["wall_s"],
           "goodput_mbps": round(sum(f["goodput_bps"] for f in r["flows"]) / 1e6, 2),
           "cpu_idle_min_pct": r["fidelity"]["cpu_idle_min_pct"],
           "valid": r["fidelity"]["valid"]}
    if split:
        row["workers"] = r["cluster"]["fidelity"]
        row["clock"] = r["cluster"]["clock"]
    else:
        row["lab_cpu_pct"] = r["fidelity"].get("lab_cpu_pct")
    return row


def measure() -> dict[str, Any]:
    acc = json.loads(_head("cat /etc/fabriclab/vm.json"))["accelerator"]
    links = [_link_probe("veth"), _link_probe("gre")]
    runs = [_run(False), _run(True)]
    return {"accelerator": acc, "links": links, "runs": runs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--estimate", action="store_true")
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--nic-mbps", type=float, default=1000.0)
    ap.add_argument("--json", default=str(OUT / "cluster.json"))
    args = ap.parse_args()
    if not (args.estimate or args.measure):
        args.estimate = True
    doc: dict[str, Any] = {"bench": "cluster", "date": time.strftime("%Y-%m-%d"),
                           "machine": "CI machine (2 cores, TCG guests)"}
    if args.estimate:
        doc["estimate"] = estimate(args.cores, args.nic_mbps)
        for row in doc["estimate"]:
            print(f"k={row['k']} at {row['link_mbps']:g} Mbit/s ({row['switches']} switches, "
                  f"{row['flows']} flows): {row.get('machines')} machines of "
                  f"{args.cores} cores (load {row.get('load')}); each needs "
                  f"{row.get('tunnel_mbps_per_worker')} Mbit/s of NIC each way at full load "
                  f"({'within' if row.get('nic_holds') else 'above'} {args.nic_mbps:g})")
    if args.measure:
        doc["measure"] = measure()
        for ln in doc["measure"]["links"]:
            print(f"{ln['link']:5} RTT min {ln['rtt_min_ms']} ms avg {ln['rtt_avg_ms']} ms, "
                  f"TCP {ln['tcp_mbps']} Mbit/s")
        for r in doc["measure"]["runs"]:
            print(f"ecmp-basic on {r['machines']} machine(s): ready {r['ready_s']} s, wall "
                  f"{r['wall_s']} s, goodput {r['goodput_mbps']} Mbit/s, least idle "
                  f"{r['cpu_idle_min_pct']} %" + (f", workers {r['workers']}"
                                                  if "workers" in r else ""))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
