"""What the roce kind's result.json says: per group of QPs its goodput and a NIC's counters,
per class the drops, the pauses as a tree from the congested port upstream, and the lines
``fabriclab run`` prints and ``fabriclab regress`` holds a policy to.

Every number comes from a counter that packets moved: goodput from the transport's
completions, drops from each class's leaf queue, pauses from pfcd's per port and priority
counters, paths from the switches' per-flow counters.
"""

from __future__ import annotations

from typing import Any

from lab.analysis import pauses, predict
from lab.analysis import uplinks as up
from lab.kinds.base import PhaseCounts, Plan, phased_part
from lab.kinds.roce.plan import RoceFlow
from lab.model.flowpaths import attachment

#: Seconds after the last QP joined before rates are judged for fairness: DCQCN's rate
#: recovery, scaled to the lab's link rates (docs/roce.md), takes seconds, not microseconds.
FAIRNESS_SETTLE_S = 2.0


def jain(values: list[float]) -> float | None:
    """Jain's fairness index: 1 when all are equal, 1/n when one has everything."""
    if not values or not any(values):
        return None
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def fairness(pp: dict[str, Any], flows: list[RoceFlow],
             details: dict[str, Any]) -> dict[str, Any] | None:
    """Under DCQCN, once every QP has joined and settled, per receiver with several QPs:
    each QP's mean DCQCN rate (what its pacer was allowed), Jain's index over them, and the
    receiver port's queue (p50, p95) - the queue DCQCN holds near Kmin. None without DCQCN
    or when the phase ends before the window opens."""
    flows = [f for f in flows if f.transport == "roce"]
    t_from = max((f.start_s for f in flows), default=0.0) + FAIRNESS_SETTLE_S
    t_to = float(pp["duration"])
    if pp["roce"]["cc"] != "dcqcn" or t_to - t_from < 1.0:
        return None
    by_rx: dict[str, dict[str, int]] = {}
    for f in flows:
        q = ((details["transport"].get(f.flow.id) or {}).get("qps") or [{}])[0]
        rc = [s[1] for s in q.get("rate_samples", []) if t_from <= f.start_s + s[0] <= t_to]
        by_rx.setdefault(f.flow.dst, {})[f.flow.id] = round(sum(rc) / len(rc)) if rc else 0
    ports = {ln["peer"]: ln for ln in details["links"]}
    receivers = {}
    for rx, rates in sorted(by_rx.items()):
        if len(rates) < 2:
            continue
        s = ports[rx].get("series") or {}
        qs = sorted(b for t, b in zip(s.get("t", []), s.get("queue_bytes", []), strict=False)
                    if t_from <= t <= t_to)
        index = jain(list(rates.values()))
        receivers[rx] = {"port": ports[rx]["intf"], "rate_bps": rates,
                         "jain": round(index, 4) if index is not None else None,
                         "queue_p50_bytes": qs[len(qs) // 2] if qs else None,
                         "queue_p95_bytes": qs[min(len(qs) - 1, int(len(qs) * 0.95))]
                         if qs else None}
    return {"from_s": t_from, "to_s": t_to, "kmin_bytes": pp["ecn"]["kmin_bytes"],
            "kmax_bytes": pp["ecn"]["kmax_bytes"], "xoff_bytes": pp["pfc"]["xoff_bytes"],
            "receivers": receivers}


def split(flows: list[RoceFlow], details: dict[str, Any], topo: dict[str, Any],
          policy: str, seed: int) -> dict[str, Any] | None:
    """The first sender's leaf uplinks: each one's utilisation and their imbalance, beside
    what the policy's function predicts for the same 5-tuples (a sprayed QP's rate split
    evenly over its source ports, which is what round-robin spraying sends on each)."""
    roce = [f for f in flows if f.transport == "roce"]
    if not roce:
        return None
    att = attachment(topo)
    leaf = att[roce[0].flow.src]
    mine = [e for e in details["flows"] if att.get(e["src"]) == leaf != att.get(e["dst"])]
    uplinks = up.of(details["links"], topo, leaf)
    if not uplinks or not mine:
        return None
    pred = predict.uplink_prediction({"policy": policy, "seed": seed, "topology": topo,
                                      "links": details["links"], "flows": mine}, leaf)
    return {"switch": leaf, **up.split(uplinks), "predicted_imbalance": pred["imbalance"]}


def phase_metrics(pp: dict[str, Any], flows: list[RoceFlow], details: dict[str, Any],
                  topo: dict[str, Any], policy: str = "hash5", seed: int = 1) -> dict[str, Any]:
    """One phase's numbers: goodput and transport counters per group, drops per class,
    PFC's pauses and their tree, CE marks, and the settings that made them."""
    outputs = details["transport"]
    groups: dict[str, dict[str, Any]] = {}
    for f in flows:
        # goodput and retransmits are every flow's result (lab.workloads.rocebw's for a
        # QP, iperf3's for TCP); the NIC's own counters only a QP has
        r, o = f.flow.result, outputs.get(f.flow.id) or {}
        t, resp = o.get("totals") or {}, o.get("responder") or {}
        g = groups.setdefault(f.group, {"transport": f.transport, "qps": 0,
                                        "goodput_bps": 0.0, "retransmitted": 0, "naks": 0,
                                        "timeouts": 0, "cnps": 0, "ce": 0,
                                        # reordering, as the receivers saw it
                                        "placed_out_of_order": 0, "out_of_sequence": 0,
                                        "offered_bps": 0.0, "qp_errors": [],
                                        "per_qp_bps": {}})
        bps = float(r.get("goodput_bps") or 0.0)
        g["qps"] += 1
        g["goodput_bps"] += bps
        g["offered_bps"] += f.flow.rate_bps
        g["per_qp_bps"][f.flow.id] = round(bps)
        g["retransmitted"] += int(r.get("retransmits") or 0)
        g["naks"] += int(t.get("naks_received", 0))
        g["timeouts"] += int(t.get("rto_events", 0))
        g["cnps"] += int(t.get("cnps_received", 0))
        g["ce"] += int(resp.get("ce_received", 0))
        g["placed_out_of_order"] += int(resp.get("placed_out_of_order", 0))
        g["out_of_sequence"] += int(resp.get("out_of_sequence", 0))
        if o.get("error") and not o.get("missing"):
            g["qp_errors"].append(f"{f.flow.id}: {o['error']}")
    for g in groups.values():
        g["goodput_bps"] = round(g["goodput_bps"])
    pfc = details["pfc"] or {}
    return {
        "pfc": bool(pp["pfc"]["enabled"]), "ecn": pp["ecn"]["marking"],
        "cc": pp["roce"]["cc"], "spray": pp["roce"]["spray"],
        "placement": pp["roce"]["placement"], "groups": groups,
        **pauses.summary(details["classes"], details["pfc"], details["pfc_feeders"]),
        "ce_marked": sum(ln.get("ce_marked", 0) for ln in details["links"]),
        "pfcd_cpu_per_s": (pfc.get("cpu") or {}).get("per_s"),
        "fairness": fairness(pp, flows, details),
        "split": split(flows, details, topo, policy, seed),
        "receiver_cpu_pct": receiver_cpu(flows, outputs),
    }


def receiver_cpu(flows: list[RoceFlow], outputs: dict[str, Any]) -> float | None:
    """The RoCE receivers' own CPU, % of a core, the mean over receiving hosts (one server
    each, whatever the number of its QPs); None when no server said."""
    per_rx = {f.flow.dst: o["receiver_cpu_pct"] for f in flows if f.transport == "roce"
              and (o := outputs.get(f.flow.id)) and o.get("receiver_cpu_pct") is not None}
    return round(sum(per_rx.values()) / len(per_rx), 2) if per_rx else None


def assemble(plan: Plan, phases: dict[str, dict[str, Any]], loss: float) -> dict[str, Any]:
    """The kind's part of result.json: every phase's metrics, each group's goodput against
    the baseline phase's (``baseline``: the phase without the trouble), the first other
    phase's links and flows on top."""
    per = {n: p["metrics"] for n, p in phases.items()}
    base = plan.params.get("baseline")
    if base in per:
        for m in per.values():
            for g, v in m["groups"].items():
                ref = per[base]["groups"].get(g, {}).get("goodput_bps")
                v["vs_baseline"] = round(v["goodput_bps"] / ref, 4) if ref else None
    # The phase the scenario is about (what diagnose explains): the first that is not the
    # baseline.
    first = next((n for n in phases if n != base), next(iter(phases)))
    metrics = {**per[first], "phases": per, "baseline": base, "pingall_loss_pct": loss}
    notes = [e for p in phases.values() for e in p["errors"]]
    counts: dict[str, PhaseCounts] = {n: p["counts"] for n, p in phases.items()}
    return phased_part(plan, counts, first, metrics, notes=notes, valid=loss == 0,
                       fidelity={"pfc": "pfcd on htb classes (controllers/pfc)",
                                 "transport": "roce_bw (lab/agents/roce)"})


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """Per phase: each group's goodput (and against the baseline), lossless drops, pauses."""
    rows = []
    for name, m in result["metrics"]["phases"].items():
        groups = ", ".join(
            f"{g} {v['goodput_bps'] / 1e6:.1f} Mbit/s" + (
                f" ({v['vs_baseline'] * 100:.0f} %)" if v.get("vs_baseline") else "")
            for g, v in m["groups"].items())
        rows.append((name, f"{groups}; lossless drops {m['lossless_drops']}, "
                           f"pause {m['pause_time_s']:.2f} s over "
                           f"{m['pause_tree']['max_hops']} hops, CE {m['ce_marked']}"))
        fair = m.get("fairness") or {}
        for rx, v in fair.get("receivers", {}).items():
            rows.append(("", f"into {rx} from {fair['from_s']:g} s: DCQCN rates "
                             + " ".join(f"{r / 1e6:.1f}" for r in v["rate_bps"].values())
                             + f" Mbit/s, Jain {v['jain']:.3f}; {v['port']} queue p50 "
                             f"{v['queue_p50_bytes']} B, p95 {v['queue_p95_bytes']} B"))
    return rows


def regress_metrics(result: dict[str, Any]) -> dict[str, float]:
    """Per phase: drops in the lossless class (a lossless fabric's must be 0), the time
    ports spent paused, and each group's goodput shortfall, against the baseline phase's
    goodput where the scenario names one (a victim's loss), else against its line rate;
    the reordering the receivers saw and their own CPU."""
    out: dict[str, float] = {}
    for name, m in result["metrics"]["phases"].items():
        out[f"{name}.lossless_drops"] = float(m["lossless_drops"])
        out[f"{name}.pause_time_s"] = float(m["pause_time_s"])
        for g, v in m["groups"].items():
            share = v.get("vs_baseline")
            if share is None:
                share = v["goodput_bps"] / v["offered_bps"] if v["offered_bps"] else 1.0
            out[f"{name}.{g}.goodput_shortfall"] = round(max(0.0, 1 - share), 4)
        split = m.get("split")
        if split:
            out[f"{name}.imbalance"] = float(split["imbalance"])
            out[f"{name}.max_uplink_util"] = float(split["max_uplink_util"])
        gs = m["groups"].values()
        offered = sum(g["offered_bps"] for g in gs)
        if offered:
            out[f"{name}.goodput_shortfall"] = round(
                max(0.0, 1 - sum(g["goodput_bps"] for g in gs) / offered), 4)
        out[f"{name}.retransmits"] = float(sum(g["retransmitted"] for g in gs))
        # what the receivers saw out of order: discarded (go-back-N) or placed
        out[f"{name}.reordering"] = float(sum(g["out_of_sequence"] + g["placed_out_of_order"]
                                              for g in gs))
        if m.get("receiver_cpu_pct") is not None:
            out[f"{name}.receiver_cpu_pct"] = float(m["receiver_cpu_pct"])
    return out


def predictions(result: dict[str, Any]) -> dict[str, float]:
    """Per phase, the policy's prediction of the senders' uplinks' imbalance (a sprayed QP
    split evenly over its source ports), beside what regress measured."""
    return {f"{name}.imbalance": float(m["split"]["predicted_imbalance"])
            for name, m in result["metrics"]["phases"].items() if m.get("split")}
