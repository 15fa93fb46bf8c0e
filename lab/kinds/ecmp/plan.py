"""The ecmp kind's scenario: its keys, and the elephant flows from one leaf's hosts to
another's, 5-tuples drawn from the seed - checked before anything starts."""

from __future__ import annotations

import random
from typing import Any

from lab.measure import queuefeed
from lab.model.errors import ScenarioError
from lab.model.flows import BASE_DPORT, MPTCP_MAX_SUBFLOWS, FlowSpec, pick_source_ports
from lab.model.scenario import Param, require
from lab.model.topodesc import check_fabric, edge_switches, hosts_of, uplink_capacity_bps
from lab.workloads import faults, mptcp

SCHEMA: dict[str, Param] = {
    "traffic.flows": Param(int, 1, 128),
    # mptcp: each flow one MPTCP connection (iperf3 under mptcpize) of traffic.subflows
    "traffic.proto": Param(str, choices=("tcp", "udp", "mptcp")),
    "traffic.subflows": Param(int, 2),
    # known only to be refused with the reason: TCP is not sprayed (docs/kinds/ecmp.md)
    "traffic.spray": Param(int, 1),
    "traffic.load": Param(float, 0.01, 2.0),
    "traffic.pairs": Param(int, 0, 4096),
    "traffic.cc": Param(str, choices=("cubic", "reno", "bbr")),
    # the adaptive policy's congested queue (lab.measure.queuefeed; default half the queue)
    queuefeed.KEY: Param(int, 1),
    "faults": Param(list),    # lab.workloads.faults: links down, a switch dark, controller kill
}


#: The values an ecmp scenario must give: there is no sensible default for them.
REQUIRED = ["traffic.flows", "traffic.proto", "traffic.load"]
#: Subflows of an MPTCP flow when the scenario does not say: one per path of a 4-spine fabric.
DEFAULT_SUBFLOWS = 4


def subflows(t: dict[str, Any]) -> int:
    """Subflows per connection: 1 unless ``traffic.proto`` is mptcp; checked against the
    machine (an MPTCP kernel, mptcpize) and the path manager's limit."""
    n = t.get("subflows")
    if t["proto"] != "mptcp":
        if n is not None:
            raise ScenarioError("traffic.subflows", "only an mptcp flow has subflows "
                                f"(traffic.proto is {t['proto']})")
        return 1
    n = DEFAULT_SUBFLOWS if n is None else n
    if n > MPTCP_MAX_SUBFLOWS:
        raise ScenarioError("traffic.subflows", f"{n} is more than the kernel path "
                            f"manager's limit of {MPTCP_MAX_SUBFLOWS} per connection "
                            "(ip mptcp limits)")
    why = mptcp.unavailable()
    if why:
        raise ScenarioError("traffic.proto", f"mptcp: {why}")
    return n


def flows(topo_desc: dict, params: dict[str, Any], rng: random.Random) -> list[FlowSpec]:
    """Flows from the hosts of the first edge switch to the hosts of the last one."""
    require(params, REQUIRED, "ecmp")
    check_fabric(topo_desc, "ecmp", min_edges=2)     # flows cross from one leaf to another
    faults.parse(params.get("faults"), topo_desc, float(params.get("duration", 600)))
    queuefeed.threshold(params, topo_desc)
    t = params["traffic"]
    edges = edge_switches(topo_desc)
    src_sw, dst_sw = edges[0], edges[-1]
    srcs, dsts = hosts_of(topo_desc, src_sw), hosts_of(topo_desc, dst_sw)
    n = t["flows"]
    pairs = t.get("pairs", 0) or max(len(srcs), len(dsts))
    rate = t["load"] * uplink_capacity_bps(topo_desc, src_sw) / n
    ips = {h["name"]: h["ip"] for h in topo_desc["hosts"]}
    sports = pick_source_ports(n, rng)
    per = subflows(t)
    if t.get("spray", 1) > 1:
        raise ScenarioError("traffic.spray", f"{t['proto']} flows cannot be sprayed: no "
                            "field of a TCP or UDP packet carries per-packet entropy the "
                            "switches hash without breaking the flow; RoCE QPs can (the "
                            "roce kind's roce.spray, as in the multipath scenario)")
    planned = []
    for i in range(n):
        j = i % pairs
        src, dst = srcs[j % len(srcs)], dsts[j % len(dsts)]
        planned.append(FlowSpec(id=f"f{i + 1}", src=src, dst=dst, src_ip=ips[src],
                              dst_ip=ips[dst], proto="tcp" if per > 1 else t["proto"],
                              sport=sports[i], dport=BASE_DPORT + i, rate_bps=rate,
                              cc=t.get("cc"), subflows=per))
    return planned


