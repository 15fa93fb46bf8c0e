"""What a policy should do to a run's flows, computed from the policy alone (no packets).

The emulated run measures where bytes went; this module asks the same policy class, offline,
where it would send those very 5-tuples, and what the uplinks would then carry. Agreement is
the check that the fabric did what the function says (and that the offline evaluation in
``lab.analysis.offline`` can be trusted for the flow sets no one has time to emulate).
Disagreement is a finding: a switch hashing differently from its model (``ovs-select``), a
stateful policy seeing different loads, or congestion the model does not capture.
"""

from __future__ import annotations

from typing import Any

from controllers import policies
from controllers.policies import FlowKey
from lab.analysis import bins as m

PROTO = {"tcp": 6, "udp": 17}


def policy_of(result: dict[str, Any]) -> type[policies.HashPolicy]:
    """The policy class a result was produced with (a user's file when it names one)."""
    return policies.resolve(result.get("policy_file") or result["policy"])


def uplink_prediction(result: dict[str, Any], src_switch: str) -> dict[str, Any]:
    """Per-uplink flows and carried bit/s that ``result``'s policy predicts for its flows.

    Each flow's first decision is at ``src_switch`` among its uplinks (sorted port numbers,
    as the controller offers them). A link carries the sum of its flows' offered rates, at
    most its capacity: an over-subscribed uplink saturates rather than carrying more.
    """
    cls = policy_of(result)
    policy = cls(seed=int(result["seed"]))
    hosts = {h["name"] for h in result["topology"]["hosts"]}
    uplinks = {ln["port"]: ln for ln in result["links"]
               if ln["node"] == src_switch and ln["peer"] not in hosts}
    ports = sorted(uplinks)
    flows_on = {p: 0 for p in ports}
    bps_on = {p: 0.0 for p in ports}
    # An MPTCP connection's offered rate, split evenly over its subflows: what its scheduler
    # sends on each while no path is congested.
    members: dict[str, int] = {}
    for f in result["flows"]:
        conn = f.get("subflow_of") or f["id"]
        members[conn] = members.get(conn, 0) + 1
    offered = {f["id"]: f["offered_bps"] for f in result["flows"] if not f.get("subflow_of")}
    for f in result["flows"]:
        key = FlowKey(f["src_ip"], f["dst_ip"], PROTO[f["proto"]], f["sport"], f["dport"])
        if cls.granularity == "pair":
            key = FlowKey(key.src, key.dst, 0, 0, 0)      # what the controller hashes
        conn = f.get("subflow_of") or f["id"]
        share = offered.get(conn, 0.0) / members[conn]
        port = policy.choose(key, src_switch, ports)
        policy.placed(key, src_switch, port, share)
        flows_on[port] += 1
        bps_on[port] += share
    carried = {p: min(bps_on[p], uplinks[p]["bw_mbps"] * 1e6) for p in ports}
    name = {p: f"{src_switch}->{uplinks[p]['peer']}" for p in ports}
    return {
        "flows_per_uplink": {name[p]: flows_on[p] for p in ports},
        "carried_bps": {name[p]: round(carried[p]) for p in ports},
        "imbalance": round(m.imbalance(list(carried.values())), 4),
        "max_flows_per_uplink": max(flows_on.values(), default=0),
        # ovs-select's choose is a model of the switch's own hash, not its decisions.
        "model_only": cls.granularity == "switch",
    }
