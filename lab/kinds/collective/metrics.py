"""A job's numbers, as nccl-tests and a training loop would report them.

- step time: from the workers' own clocks, the job's step is its slowest rank's (the
  barrier makes every rank wait for it); p50/p99 over the measured (non-warm-up) steps.
- GPU idle fraction: time a rank is not computing over its step time, summed over ranks
  and steps: what the network costs the GPUs.
- algbw = S / t and busbw = algbw · 2(N−1)/N for a ring All-Reduce (nccl-tests'
  definitions): busbw is comparable to the link rate whatever N is.
- ideal_comm_s = 2(N−1)/N · S / B for the ring's bottleneck rate B: what a perfect ring
  would take; the measured time sits beside it.

Pure functions over plain data, so the tests can check them without a network; and the
kind's part of result.json assembled from its phases, the lines ``fabriclab run`` prints
and what ``fabriclab regress`` holds a policy to.
"""

from __future__ import annotations

import itertools
from typing import Any

from controllers.marking import tcp_wire_ceiling_bps
from lab.analysis import gpuwait as gpu_diagnosis
from lab.kinds.base import PhaseCounts, Plan, phased_part
from lab.kinds.collective import gpuwait
from lab.kinds.collective.plan import phase_params
from lab.measure import headroom
from lab.model.stats import percentile


def ring_factor(n: int) -> float:
    """Bytes each rank sends per byte reduced in a ring All-Reduce: 2(N−1)/N."""
    return 2 * (n - 1) / n


def ideal_ring_s(n: int, size_bytes: int, bottleneck_bps: float) -> float:
    """A ring All-Reduce's time when every hop runs at TCP's ceiling on the slowest link's
    wire (``tcp_wire_ceiling_bps``): what no ring over TCP on that link can beat."""
    return ring_factor(n) * size_bytes * 8 / tcp_wire_ceiling_bps(bottleneck_bps)


def busbw(algbw_bps: float, n: int) -> float:
    return algbw_bps * ring_factor(n)


def ring_steps(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The job's steps from every rank's records: a step lasts as long as its slowest rank.

    ``t`` is the step's start on the shared monotonic clock.
    """
    by_step: dict[int, list[dict[str, Any]]] = {}
    for out in outputs:
        for rec in out.get("steps", []):
            by_step.setdefault(rec["step"], []).append(rec)
    steps = []
    for k in sorted(by_step):
        recs = by_step[k]
        if len(recs) != len(outputs):
            continue                       # a rank died mid-step: not a whole step
        step_s = max(r["step_s"] for r in recs)
        steps.append({
            "step": k, "epoch": recs[0].get("epoch", 0),
            "size_bytes": recs[0].get("size_bytes"),
            "warmup": any(r.get("warmup") for r in recs),
            "t_start": min(r["t_start"] for r in recs), "t_end": max(r["t_end"] for r in recs),
            "t_comm_start": min(r.get("t_comm_start", r["t_start"]) for r in recs),
            "step_s": round(step_s, 6), "comm_s": round(max(r["comm_s"] for r in recs), 6),
            "compute_s": round(sum(r["compute_s"] for r in recs) / len(recs), 6),
            "idle_s": round(sum(r["idle_s"] for r in recs), 6),
            "rank_step_s": round(sum(r["step_s"] for r in recs), 6),
        })
    return steps


def idle_fraction(steps: list[dict[str, Any]]) -> float:
    """Σ idle / Σ step time over ranks and steps: the share of GPU time spent waiting."""
    total = sum(s["rank_step_s"] for s in steps)
    return round(sum(s["idle_s"] for s in steps) / total, 4) if total else 0.0


def step_summary(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """p50/p99/mean of step and communication time, and idle fraction, over ``steps``."""
    st = [s["step_s"] for s in steps]
    cm = [s["comm_s"] for s in steps]
    return {"steps": len(steps), "step_p50_s": round(percentile(st, 50), 4),
            "step_p99_s": round(percentile(st, 99), 4),
            "step_mean_s": round(sum(st) / len(st), 4) if st else 0.0,
            "comm_p50_s": round(percentile(cm, 50), 4),
            "gpu_idle_fraction": idle_fraction(steps)}


def links_of(path: list[str]) -> list[str]:
    """Switch-to-switch links a path crosses, as ``a->b``."""
    return [f"{a}->{b}" for a, b in itertools.pairwise(path)]


def epoch_collisions(flows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per epoch: how many of the job's connections shared the busiest fabric link.

    Read from each connection's measured path (the switches' counters), not from what a
    policy was expected to do. A sprayed QP is one connection on every link any of its
    5-tuples took.
    """
    out: dict[int, dict[str, Any]] = {}
    for f in flows:
        if f.get("kind") != "allreduce":
            continue
        e = out.setdefault(f["epoch"], {"per_link": {}})
        conn = f.get("subflow_of") or f["id"]
        for ln in links_of(f["path"]):
            on = e["per_link"].setdefault(ln, [])
            if conn not in on:
                on.append(conn)
    for e in out.values():
        per = e.pop("per_link")
        e["max_flows_per_link"] = max((len(v) for v in per.values()), default=0)
        e["shared_links"] = {k: v for k, v in sorted(per.items()) if len(v) > 1}
        e["links_crossed"] = len(per)
        e["collided"] = e["max_flows_per_link"] > 1
    return out


def overlaps(step: dict[str, Any], windows: list[tuple[float, float]]) -> bool:
    """Whether a window (a checkpoint) overlaps the step's communication.

    Its communication, from the first send to the barrier's end, not its compute: a
    checkpoint shares the NIC with the ring's bytes, so a step whose compute alone
    overlapped it is not slowed by it (3-6 of allreduce-shared-link's 24 steps in three runs;
    counted as "during" they hid the slowdown of the others: 1.09-1.13x against 1.20-1.35x).
    """
    return any(a < step["t_end"] and b > step["t_comm_start"] for a, b in windows)


def ring_metrics(outputs: list[dict[str, Any]], n: int, size_bytes: int,
                 bottleneck_bps: float, flows: list[dict[str, Any]],
                 checkpoints: list[tuple[float, float]] | None = None) -> dict[str, Any]:
    """A ring job's ``metrics`` for one phase: step times, algbw/busbw, idle, per-epoch sharing."""
    steps = ring_steps(outputs)
    # A sweep's headline numbers are its largest size's (``size_bytes``); ``sweep`` has all.
    measured = [s for s in steps if not s["warmup"]
                and s.get("size_bytes") in (None, size_bytes)]
    summary = step_summary(measured)
    algbw = size_bytes * 8 / summary["comm_p50_s"] if summary["comm_p50_s"] else 0.0
    ideal = ideal_ring_s(n, size_bytes, bottleneck_bps)
    coll = epoch_collisions(flows)
    for s in steps:
        s["collided"] = coll.get(s["epoch"], {}).get("collided", False)
        s["max_flows_per_link"] = coll.get(s["epoch"], {}).get("max_flows_per_link", 0)
    out: dict[str, Any] = {
        "pattern": "ring", "workers": n, "size_bytes": size_bytes, **summary,
        "algbw_bps": round(algbw), "busbw_bps": round(busbw(algbw, n)),
        "bottleneck_bps": bottleneck_bps, "ideal_comm_s": round(ideal, 4),
        "comm_vs_ideal": round(summary["comm_p50_s"] / ideal, 3) if ideal else 0.0,
        "epochs": {str(k): v for k, v in sorted(coll.items())},
        "links_crossed": len({ln for f in flows if f.get("kind") == "allreduce"
                              for ln in links_of(f["path"])}),
        "step_series": [{k: s[k] for k in ("step", "epoch", "warmup", "step_s", "comm_s",
                                           "compute_s", "collided", "max_flows_per_link")}
                        | {"idle_fraction": round(s["idle_s"] / s["rank_step_s"], 4)
                           if s["rank_step_s"] else 0.0} for s in steps],
    }
    by_collision = {"collided": [s for s in measured if s["collided"]],
                    "clean": [s for s in measured if not s["collided"]]}
    out["by_collision"] = {k: step_summary(v) for k, v in by_collision.items()}
    # Step time against how many of the job's connections shared its busiest link.
    sharing = sorted({s["max_flows_per_link"] for s in measured})
    out["by_link_sharing"] = {str(k): step_summary([s for s in measured
                                                    if s["max_flows_per_link"] == k])
                              for k in sharing}
    if checkpoints is not None:
        t0 = min((s["t_start"] for s in steps), default=0.0)
        for s in steps:
            s["checkpoint"] = overlaps(s, checkpoints)
        for e, s in zip(out["step_series"], steps, strict=True):
            e["checkpoint"] = s["checkpoint"]
        out["by_checkpoint"] = {
            "during": step_summary([s for s in measured if s["checkpoint"]]),
            "outside": step_summary([s for s in measured if not s["checkpoint"]])}
        out["checkpoints"] = [{"t_s": round(a - t0, 3), "duration_s": round(b - a, 3)}
                              for a, b in sorted(checkpoints)]
    return out


def sweep_rows(outputs: list[dict[str, Any]], n: int,
               bottleneck_bps: float) -> list[dict[str, Any]]:
    """nccl-tests' table, one row per size: ``count`` float32 elements, ``time_s`` the
    median all-reduce time of the measured steps, algbw = S / t, busbw = algbw · 2(N−1)/N,
    and the ideal a ring over TCP reaches on the bottleneck's wire: its payload ceiling C
    (``tcp_wire_ceiling_bps``, 47.07 Mbit/s of 50), time 2(N−1)/N · S / C, busbw C."""
    ceiling = tcp_wire_ceiling_bps(bottleneck_bps)
    by_size: dict[int, list[float]] = {}
    for s in ring_steps(outputs):
        if not s["warmup"] and s.get("size_bytes"):
            by_size.setdefault(int(s["size_bytes"]), []).append(s["comm_s"])
    rows = []
    for size, times in sorted(by_size.items()):
        t = percentile(times, 50)
        algbw = size * 8 / t if t else 0.0
        rows.append({"size_bytes": size, "count": size // 4, "steps": len(times),
                     "time_s": round(t, 6), "algbw_bps": round(algbw),
                     "busbw_bps": round(busbw(algbw, n)),
                     "ideal_time_s": round(ideal_ring_s(n, size, bottleneck_bps), 6),
                     "ideal_busbw_bps": round(ceiling),
                     "busbw_vs_ideal": round(busbw(algbw, n) / ceiling, 4)})
    return rows


def sweep_table(rows: list[dict[str, Any]]) -> list[str]:
    """The sweep as nccl-tests prints it (its units: bytes, µs, GB/s; here Mbit/s too)."""
    out = [f"{'size (B)':>10} {'count':>9} {'time (us)':>10} {'algbw':>8} {'busbw':>8}"
           f" {'ideal':>8} {'bus/ideal':>9}   (Mbit/s; ideal: TCP's ceiling on the wire)"]
    for r in rows:
        out.append(f"{r['size_bytes']:>10} {r['count']:>9} {r['time_s'] * 1e6:>10.0f} "
                   f"{r['algbw_bps'] / 1e6:>8.2f} {r['busbw_bps'] / 1e6:>8.2f} "
                   f"{r['ideal_busbw_bps'] / 1e6:>8.2f} {r['busbw_vs_ideal']:>9.3f}")
    return out


def incast_metrics(sink: dict[str, Any], senders: int, burst_bytes: int, gap_s: float,
                   bottleneck_bps: float, warmup: int = 1) -> dict[str, Any]:
    """A many-to-one job: a step is the time until the receiver has every sender's burst.

    The first ``warmup`` steps (new connections still in slow start) are not measured.
    """
    for s in sink.get("steps", []):
        s["warmup"] = s["step"] < warmup
    steps = [s for s in sink.get("steps", []) if not s["warmup"]]
    st = [s["step_s"] for s in steps]
    total = senders * burst_bytes
    p50 = percentile(st, 50)
    algbw = total * 8 / p50 if p50 else 0.0
    ideal = total * 8 / tcp_wire_ceiling_bps(bottleneck_bps)
    busy = sum(st)
    return {
        "pattern": "incast", "workers": senders + 1, "size_bytes": total, "steps": len(st),
        "step_p50_s": round(p50, 4), "step_p99_s": round(percentile(st, 99), 4),
        "step_max_s": round(max(st, default=0.0), 4),
        "step_mean_s": round(busy / len(st), 4) if st else 0.0,
        "comm_p50_s": round(p50, 4),
        # The GPUs compute for gap_s, then wait for the burst to land.
        "gpu_idle_fraction": round(busy / (busy + gap_s * len(st)), 4) if st else 0.0,
        # Every byte crosses the receiver's link, so bus and algorithm bandwidth agree.
        "algbw_bps": round(algbw), "busbw_bps": round(algbw),
        "bottleneck_bps": bottleneck_bps,
        "ideal_comm_s": round(ideal, 4),
        "comm_vs_ideal": round(p50 / ideal, 3) if p50 else 0.0,
        "step_series": [{"step": s["step"], "step_s": s["step_s"],
                         "warmup": bool(s.get("warmup"))} for s in sink.get("steps", [])],
    }


def ddp_metrics(outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """A DDP job's own numbers (``job.program: ddp``), from its ranks' hook-timed steps.

    Per step: forward, backward's compute and optimizer time (mean over ranks), the
    all-reduce time (first bucket's start to last bucket's end, the slowest rank's), the
    communication left exposed after backward (the slowest rank's) and the overlap, the
    share of the buckets' communication that fell inside backward. Over the measured steps:
    their p50s, and ``overlap_fraction`` = Σ overlapped / Σ communication over ranks and
    steps. What DDP was asked and did: ``bucket_cap_mb``, ``buckets`` and their bytes (a
    measured step's: DDP rebuilds its buckets after the first step), ``first_bucket_mb``,
    ``grad_bytes``.
    """
    by_step: dict[int, list[dict[str, Any]]] = {}
    for out in outputs:
        for rec in out.get("steps", []):
            by_step.setdefault(rec["step"], []).append(rec)
    series = []
    for k in sorted(by_step):
        recs = by_step[k]
        if len(recs) != len(outputs) or any("fwd_s" not in r for r in recs):
            continue
        n = len(recs)
        series.append({
            "step": k, "warmup": any(r.get("warmup") for r in recs),
            "fwd_s": round(sum(r["fwd_s"] for r in recs) / n, 6),
            "bwd_s": round(sum(r["bwd_s"] for r in recs) / n, 6),
            "opt_s": round(sum(r["opt_s"] for r in recs) / n, 6),
            "comm_s": round(max(r["comm_s"] for r in recs), 6),
            "exposed_comm_s": round(max(r["exposed_comm_s"] for r in recs), 6),
            "overlap": round(sum(r["overlap"] for r in recs) / n, 4),
            "buckets": max(r["buckets"] for r in recs),
            "_busy": sum(r["comm_busy_s"] for r in recs),
            "_hidden": sum(r["overlap"] * r["comm_busy_s"] for r in recs),
        })
    measured = [s for s in series if not s["warmup"]]
    busy = sum(s["_busy"] for s in measured)
    info = next((o["ddp"] for o in outputs if o.get("ddp")), {})

    def p50(key: str) -> float:
        return round(percentile([s[key] for s in measured], 50), 4)
    return {
        "bucket_cap_mb": info.get("bucket_cap_mb"),
        "first_bucket_mb": info.get("first_bucket_mb"), "buckets": info.get("buckets"),
        "bucket_bytes": info.get("bucket_bytes"), "grad_bytes": info.get("grad_bytes"),
        "params": info.get("params"),
        "model": {k: info.get(k) for k in ("blocks", "width", "hidden", "batch")},
        "fwd_p50_s": p50("fwd_s"), "bwd_p50_s": p50("bwd_s"), "opt_p50_s": p50("opt_s"),
        "comm_p50_s": p50("comm_s"), "exposed_comm_p50_s": p50("exposed_comm_s"),
        "overlap_fraction": round(sum(s["_hidden"] for s in measured) / busy, 4)
        if busy else 0.0,
        "series": [{k: v for k, v in s.items() if not k.startswith("_")} for s in series],
    }


def queue_delay_ms(series: list[int], rate_bps: float) -> dict[str, float]:
    """Queueing delay a packet arriving at each sample would see: backlog / drain rate."""
    d = [b * 8 / rate_bps * 1000 for b in series]
    return {"p50": round(percentile(d, 50), 3), "p99": round(percentile(d, 99), 3),
            "max": round(max(d, default=0.0), 3)}


def phase_line(mt: dict[str, Any]) -> str:
    """One line for the terminal per phase."""
    line = (f"step p50 {mt['step_p50_s'] * 1000:.0f} ms p99 {mt['step_p99_s'] * 1000:.0f} ms, "
            f"GPU idle {mt['gpu_idle_fraction'] * 100:.0f}%, busbw "
            f"{mt['busbw_bps'] / 1e6:.1f} Mbit/s (ideal comm {mt['ideal_comm_s'] * 1000:.0f} ms,"
            f" measured {mt['comm_p50_s'] * 1000:.0f} ms)")
    if mt.get("ddp"):
        d = mt["ddp"]
        line += (f"; DDP fwd {d['fwd_p50_s'] * 1000:.0f} bwd {d['bwd_p50_s'] * 1000:.0f} "
                 f"all-reduce {d['comm_p50_s'] * 1000:.0f} ms, {d['buckets']} buckets, "
                 f"{d['overlap_fraction'] * 100:.0f}% overlapped")
    if mt.get("gpu_wait"):
        line += gpuwait.line(mt["gpu_wait"])
    if mt.get("retransmits") is not None:
        line += f", {mt['retransmits']} retransmits"
    if mt.get("ce_marked"):
        line += f", {mt['ce_marked']} CE marks"
    if "pause_tree" in mt:              # a lossless fabric: its promise and its pauses
        line += (f", lossless drops {mt['lossless_drops']}, pause {mt['pause_time_s']:.2f} s"
                 f" over {mt['pause_tree']['max_hops']} hops")
    if mt.get("incast"):
        line += f", incast beside it {mt['incast']['goodput_mbps']:.1f} Mbit/s"
    return line


# -- the kind's part of result.json ----------------------------------------------------------
def assemble(plan: Plan, phases: dict[str, Any], loss: float,
             skipped: dict[str, str]) -> dict[str, Any]:
    """The kind's part of result.json (``lab.kinds.base.phased_part``): top-level links,
    flows and metrics are the first phase's (the problem the scenario shows);
    ``metrics.phases`` and ``phase_details`` hold every phase that ran,
    ``metrics.phases_skipped`` why the others did not."""
    first = next(iter(phases))
    metrics = dict(phases[first]["metrics"])
    metrics["phases"] = {n: p["metrics"] for n, p in phases.items()}
    metrics["pingall_loss_pct"] = loss
    metrics["phases_skipped"] = dict(skipped)
    notes = [f"{n}: {why}" for n, why in skipped.items()]
    counts = {n: PhaseCounts(
        duration_s=p["duration_s"], links=p["links"], flows=p["flows"],
        cpu_idle_min_pct=p["metrics"]["cpu_idle_min_pct"],
        lab_cpu_pct=p["metrics"]["lab_cpu_pct"], valid=p["metrics"]["fidelity_valid"],
        cpu=headroom.cpu_fields(p["metrics"]),
        details={k: p[k] for k in ("duration_s", "links", "flows", "cpu_idle_pct", "gpu_wait",
                                   "t_window_start", "scheduler", "pfc", "pfc_feeders",
                                   "classes")
                 if k in p})
        for n, p in phases.items()}
    part = phased_part(plan, counts, first, metrics, notes=notes, valid=loss == 0,
                       fidelity={"step_clock": "time.monotonic (ns resolution)"})
    # What a phase's programs said went wrong, after the CPU notes of every phase.
    part["fidelity"]["notes"] += [f"{n}: {e}" for n, p in phases.items()
                                  for e in p["metrics"]["errors"]]
    params = phase_params(plan.params)
    for n, p in phases.items():         # each job's slowdown against running alone
        oj = p["metrics"].get("other_job")
        base = params[n]["other_job"]["baseline"] if oj else ""
        if oj and base in phases:
            alone = phases[base]["metrics"]["step_p50_s"]
            oj["job_step_p50_alone_s"] = alone
            oj["job_slowdown"] = round(p["metrics"]["step_p50_s"] / alone, 3) if alone else None
    if any("gpu_wait" in p for p in phases.values()):
        part["diagnosis"] = {"gpu_wait": gpu_diagnosis.diagnose(
            {**part, "topology": plan.topo_desc})}
    return part


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """Each phase's line (and a sweep's table), then the phases skipped and why."""
    rows = []
    named = (result.get("diagnosis") or {}).get("gpu_wait") or {}
    for name, mt in result["metrics"]["phases"].items():
        rows.append((name, phase_line(mt)))
        if mt.get("sweep"):
            rows += [("", line) for line in sweep_table(mt["sweep"])]
        if name in named:
            rows.append(("", "who made the GPUs wait: "
                         + (", ".join(named[name]["named"]) or "no cause beyond the "
                            "all-reduce's own time")))
    return rows + list((result["metrics"].get("phases_skipped") or {}).items())


def regress_metrics(result: dict[str, Any]) -> dict[str, float]:
    """Per hashed phase (a placed phase's job paths are the lab's, no policy's): step p99,
    GPU idle share and drops. On a lossless fabric, per phase, placed or not, the lossless
    class's drops and pause time: the pauses come from all of a phase's traffic, and the
    policy routes what the lab did not pin (another job's incast, every ACK)."""
    out = {}
    for name, mt in result["metrics"]["phases"].items():
        hashed = mt.get("paths") == "hash"
        for key in ("step_p99_s", "gpu_idle_fraction", "drops", "lossless_drops",
                    "pause_time_s"):
            if key in mt and (hashed or key in ("lossless_drops", "pause_time_s")):
                out[f"{name}.{key}"] = float(mt[key])
    return out
