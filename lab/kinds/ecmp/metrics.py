"""What the ecmp kind's result.json says beyond the counters: the split over the uplinks
beside the balls-into-bins expectation and the policy's own prediction, the lines
``fabriclab run`` prints, and what ``fabriclab regress`` holds a policy to."""

from __future__ import annotations

import math
import statistics
from typing import Any

from lab.analysis import bins as m
from lab.analysis import predict
from lab.analysis import uplinks as up
from lab.model.topodesc import edge_switches

#: Upward hops, tier by tier: where a hash chooses among equal-cost links.
UP = {("leaf", "spine"), ("edge", "agg"), ("agg", "core")}


def upward_links_used(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per upward tier, the links the flows' packets crossed (from counters) of those there.

    "There" is every link up from a switch some flow passed at that tier. Polarisation
    shows here: with one hash at every tier, the aggregation switches repeat the edge's
    choice and only half their core links carry anything.
    """
    roles = {s["name"]: s["role"] for s in result["topology"]["switches"]}
    used: dict[str, set[tuple[str, str]]] = {}
    at: dict[str, set[str]] = {}
    for f in result["flows"]:
        for a, b in zip(f["path"], f["path"][1:], strict=False):
            tier = (roles.get(a), roles.get(b))
            if tier in UP:
                name = f"{tier[0]}->{tier[1]}"
                used.setdefault(name, set()).add((a, b))
                at.setdefault(name, set()).add(a)
    out = {}
    for name, links in used.items():
        upper = name.split("->")[1]
        there = {(ln["a"], ln["b"]) for ln in result["topology"]["links"]
                 if ln["a"] in at[name] and roles.get(ln["b"]) == upper}
        out[name] = {"used": sorted(f"{a}->{b}" for a, b in links), "of": len(there)}
    return out


def analyse(result: dict[str, Any],
            reordering: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Per-uplink utilisation, imbalance, flows per uplink, expectation, goodput shortfall;
    ``reordering`` (phase -> ``lab.measure.reorder.Reordering.report()``) is kept beside the
    retransmits: a policy that spreads a flow's packets pays in reordering, not only in loss."""
    topo = result["topology"]
    src_sw = edge_switches(topo)[0]
    uplinks = up.of(result["links"], topo, src_sw)
    flows_per_uplink = {name: 0 for name in uplinks}
    for flow in result["flows"]:
        if len(flow["path"]) >= 2 and flow["path"][0] == src_sw:
            name = f"{src_sw}->{flow['path'][1]}"
            if name in flows_per_uplink:
                flows_per_uplink[name] += 1
    n, s = len(result["flows"]), len(uplinks)
    offered = sum(f["offered_bps"] for f in result["flows"])
    goodput = sum(f["goodput_bps"] for f in result["flows"])
    predicted = predict.uplink_prediction(result, src_sw)
    return {
        **up.split(uplinks),
        "uplink_drops": {name: ln["drops"] for name, ln in uplinks.items()},
        "flows_per_uplink": flows_per_uplink,
        "max_flows_per_uplink": max(flows_per_uplink.values(), default=0),
        "expected_max_flows_per_uplink": round(m.expected_max_load(n, s), 4) if s else 0,
        "p_unbalanced_expected": round(m.prob_unbalanced(n, s), 4) if s else 0,
        "unbalanced": max(flows_per_uplink.values(), default=0) > -(-n // max(s, 1)),
        "offered_bps": offered,
        "aggregate_goodput_bps": goodput,
        "goodput_shortfall": round(1 - goodput / offered, 4) if offered else 0.0,
        "retransmits": sum(f["retransmits"] for f in result["flows"]),
        # per connection (a subflow's entry has none of its own)
        "receiver_cpu_pct": round(statistics.fmean(cpu), 2) if (cpu := [
            f["receiver_cpu_pct"] for f in result["flows"] if "receiver_cpu_pct" in f])
        else 0.0,
        **({"tcp_reorder": reordering} if reordering is not None else {}),
        # The same policy, offline, on the same 5-tuples (lab.analysis.predict): what the run should
        # show if the fabric did exactly what the policy function says.
        "predicted": predicted,
        "upward_links_used": upward_links_used(result),
    }


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """Lines for the terminal summary."""
    mt = result["metrics"]
    rows = [(name, f"{u * 100:5.1f}% util, {mt['flows_per_uplink'][name]} flows, "
                   f"{mt['uplink_drops'][name]} drops")
            for name, u in mt["uplinks"].items()]
    rows += [
        ("imbalance (max/mean)", f"{mt['imbalance']:.3f}"),
        ("max flows on one uplink", f"{mt['max_flows_per_uplink']} (balls-into-bins "
                                    f"expectation {mt['expected_max_flows_per_uplink']:.2f})"),
        ("goodput / offered", f"{mt['aggregate_goodput_bps'] / 1e6:.1f} / "
                              f"{mt['offered_bps'] / 1e6:.1f} Mbit/s "
                              f"(shortfall {mt['goodput_shortfall'] * 100:.1f}%)"),
        ("retransmits", str(mt["retransmits"])),
    ]
    for phase, r in mt.get("tcp_reorder", {}).items():
        s = r["sum"]
        rows.append((f"TCP reordering ({phase})",
                     f"{s['TCPSACKReorder']} SACK, {s['TCPTSReorder']} TS, "
                     f"{s['TCPRenoReorder']} Reno; {s['TCPDSACKRecv']} DSACKs, "
                     f"{s['TCPSpuriousRTOs']} spurious RTOs; {s['TCPOFOQueue']} queued "
                     "out of order"))
    fs = mt.get("faults")
    if fs:
        react = "" if not fs["link_changes"] else "; controller rerouted within " + (
            "never" if fs["reroute_max_s"] is None else f"{fs['reroute_max_s']:.3f} s (max)")
        rows += [("faults", f"{fs['faults']} ({fs['link_changes']} link changes){react}"),
                 ("outage per flow", f"mean {fs['outage_mean_s']:.2f} s, max "
                                     f"{fs['outage_max_s']:.2f} s"),
                 ("flows black-holed", ", ".join(fs["flows_black_holed"]) or "none")]
    for c in result.get("faults", {}).get("controller_restarts", []):
        rows.append(("controller resync", f"{c['entries_before']} entries before the kill, "
                     f"{c['entries_after']} after: {c['lost']} lost, {c['new']} new, "
                     f"{c['duplicated']} duplicated, {c['counters_reset']} of "
                     f"{c['watch_counters']} counters reset"))
        rows.append(("while it was away", f"{c['goodput_while_down_bps'] / 1e6:.1f} Mbit/s "
                     f"delivered (before: {c['goodput_before_bps'] / 1e6:.1f})"))
    for tier, u in mt.get("upward_links_used", {}).items():
        rows.append((f"{tier} links used", f"{len(u['used'])} of {u['of']}"))
    if "predicted" in mt:
        pred = mt["predicted"]
        rows.append(("predicted (offline)", f"imbalance {pred['imbalance']:.3f}, max "
                     f"{pred['max_flows_per_uplink']} flows on one uplink"
                     + (" (model of the switch hash)" if pred["model_only"] else "")))
    return rows


def regress_metrics(result: dict[str, Any]) -> dict[str, float]:
    """What ``fabriclab regress`` holds a policy to: imbalance, collisions beyond a fair
    share, drops at the uplinks and the goodput shortfall."""
    mt = result["metrics"]
    n_uplinks = max(len(mt["flows_per_uplink"]), 1)
    fair = math.ceil(len(result["flows"]) / n_uplinks)
    reorder = [r["sum"] for r in mt.get("tcp_reorder", {}).values()]
    return {"imbalance": mt["imbalance"],
            "collisions": float(max(0, mt["max_flows_per_uplink"] - fair)),
            "drops": float(sum(mt["uplink_drops"].values())),
            "goodput_shortfall": mt["goodput_shortfall"],
            "max_uplink_util": float(mt.get("max_uplink_util", 0.0)),
            "retransmits": float(mt["retransmits"]),
            "reordering": float(sum(s[k] for s in reorder for k in REORDER_KEYS)),
            "receiver_cpu_pct": float(mt.get("receiver_cpu_pct", 0.0))}


#: TCP's counts of reordering it detected (by SACK, timestamps, duplicate ACKs).
REORDER_KEYS = ("TCPSACKReorder", "TCPTSReorder", "TCPRenoReorder")


def predictions(result: dict[str, Any]) -> dict[str, float]:
    """The policy's own prediction beside what regress measured: the uplinks' imbalance."""
    pred = result["metrics"].get("predicted")
    return {"imbalance": float(pred["imbalance"])} if pred else {}
