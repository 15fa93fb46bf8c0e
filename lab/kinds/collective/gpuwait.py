"""Who made the GPUs wait: a training step split into its parts, from the ranks' own records.

With a data loader (``loader.enabled``), every rank's step is the wait for its input batch,
the compute, the all-reduce's exposed part and the wait for the slowest rank, stamped on
one monotonic clock by the rank itself (``lab.agents.ring``, or ``lab.agents.ddprank``
whose compute is forward, backward and the optimizer step and whose barrier is 0), so the
four add up to the step. Per phase this keeps every rank's parts per step
(``phase_details.<phase>.gpu_wait``) and sums them into shares of step time
(``metrics.phases.<phase>.gpu_wait``): the share a diagnosis reads to say which part
grew, and the loader's queue-empty steps that say the input pipeline, not the storage link,
could not keep up.

Pure functions over the ranks' JSON, so the tests can check them without a network.
"""

from __future__ import annotations

import statistics
from typing import Any

from lab.agents.loader import STEP_PARTS
from lab.measure.telemetry import SpareWork

#: A step's parts, in the order a step lives them: the keys every rank with a loader (the
#: synthetic ring's, DDP's) writes them under.
PARTS = STEP_PARTS
#: How far the parts' sum may be from the step's time, relative: the rank stamps each
#: boundary once (rounded to the microsecond), so anything beyond rounding is a bug.
ADD_UP_REL_TOL = 0.02


def spare_work(outputs: list[dict[str, Any]], t0: float) -> list[SpareWork]:
    """The loaders' preprocessing as work burnt on purpose at idle priority: each batch's
    CPU between its fetch and its hand-over, on the sampler's clock (``t0`` its start).

    The fidelity check counts it as idle (:class:`lab.measure.telemetry.SpareWork`): the
    "cpu" cause is a host whose preprocessing cannot keep up, not an emulator out of CPU.
    """
    out = []
    for o in outputs:
        for rec in o.get("steps") or []:
            b = rec.get("batch") if isinstance(rec, dict) else None
            if b and b.get("t_ready") is not None and b.get("prep_cpu_s"):
                t1 = b["t_ready"] - t0
                out.append(SpareWork(t1 - (b.get("prep_wall_s") or 0.0), t1, b["prep_cpu_s"]))
    return out


def step_parts(rec: dict[str, Any]) -> dict[str, Any]:
    """One rank's step: its parts, its time, how full the loader's queue was at the ask,
    and how far the parts' sum is from the step's time (relative).

    Its start and end stay on the rank's clock (``time.monotonic``), so a picture can lay
    the parts beside the links' series (``t_window_start`` of the phase is their zero)."""
    row = {"step": rec["step"], "warmup": bool(rec.get("warmup")),
           **{p: rec[p] for p in PARTS}, "step_s": rec["step_s"],
           "t_start": rec.get("t_start"), "t_end": rec.get("t_end"),
           "t_compute_end": rec.get("t_compute_end"),
           "queue_depth": (rec.get("batch") or {}).get("queue_depth")}
    total = sum(rec[p] for p in PARTS)
    row["residual"] = round(abs(total - rec["step_s"]) / rec["step_s"], 6) \
        if rec["step_s"] > 0 else 0.0
    return row


def rank_details(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank: every step's parts (steps without a batch, e.g. a rank with no loader,
    are left out) and its loader's own record (parameters, per-worker bytes and CPU)."""
    out = []
    for r, o in enumerate(outputs):
        steps = [step_parts(rec) for rec in o.get("steps") or []
                 if isinstance(rec, dict) and all(p in rec for p in PARTS)]
        out.append({"rank": o.get("rank", r), "steps": steps, "loader": o.get("loader")})
    return out


def shares(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Σ part / Σ step time over ``rows``, per part."""
    total = sum(s["step_s"] for s in rows)
    return {p.removesuffix("_s"): round(sum(s[p] for s in rows) / total, 4) if total else 0.0
            for p in PARTS}


def measured_steps(ranks: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Per measured step every rank recorded (with its compute's end), the ranks' parts of
    it, in step order."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for rk in ranks:
        for s in rk["steps"]:
            if not s["warmup"] and s.get("t_compute_end") is not None:
                by_step.setdefault(s["step"], []).append(s)
    return [rows for _, rows in sorted(by_step.items()) if len(rows) == len(ranks)]


def critical_rows(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per measured step, the parts of the rank that was last to finish computing.

    In a ring a rank's all-reduce cannot end before every rank has joined it, so an early
    rank's exposed comm holds the later ranks' data wait too (with one slow loader per
    rank, 0.1-0.4 s of it against the last rank's 0.08 s); the last rank waits for no one
    to join, so its exposed comm is the all-reduce's own and its data wait the one that
    held the step.
    """
    return [_last_to_compute(rows) for rows in measured_steps(ranks)]


def _last_to_compute(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return max(rows, key=lambda s: s["t_compute_end"])


def compute_lag_share(ranks: list[dict[str, Any]]) -> float:
    """How much longer each measured step's last rank to finish computing computed than
    the step's median rank, summed, over that rank's step time: the share of the step the
    other GPUs sat idle while the slowest still computed.

    It is in no rank's own parts: the others wait for the slowest inside their all-reduce
    (a ring's chunks, DDP's buckets, need its gradients), so it shows as their exposed comm,
    and the slowest rank itself waits for no one."""
    steps = [(_last_to_compute(rows), rows) for rows in measured_steps(ranks)]
    total = sum(last["step_s"] for last, _ in steps)
    lag = sum(max(0.0, last["compute_s"] - statistics.median(s["compute_s"] for s in rows))
              for last, rows in steps)
    return round(lag / total, 4) if total else 0.0


def summary(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """A phase's parts over its measured (non-warm-up) steps of every rank.

    A share is Σ part / Σ step time over ranks and steps: the mean share weighted by step
    time, so a long step counts as long as it was (as ``gpu_idle_fraction`` does); the GPU
    idles for every part but the compute. ``critical_share``: the same over each step's last
    rank to finish computing (:func:`critical_rows`), where exposed comm is the network's
    alone; ``compute_lag_share``: how long the others waited for that rank's compute
    (:func:`compute_lag_share`). ``queue_empty_steps``: measured rank-steps whose ask found
    no batch ready.
    """
    rows = [s for rk in ranks for s in rk["steps"] if not s["warmup"]]
    share = shares(rows)
    empty = sum(1 for s in rows if s["queue_depth"] == 0)
    worst = max((s["residual"] for s in rows), default=0.0)
    per_rank = []
    for rk in ranks:
        ld = rk["loader"] or {}
        workers = ld.get("per_worker") or []
        per_rank.append({"rank": rk["rank"], "queue_empty_steps": ld.get("queue_empty_steps"),
                         "data_wait_s": ld.get("data_wait_s"),
                         "batch_bytes": sum(w.get("bytes") or 0 for w in workers),
                         "prep_cpu_s": round(sum(w.get("prep_cpu_s") or 0 for w in workers), 6),
                         "prep_wall_s": round(sum(w.get("prep_wall_s") or 0
                                                  for w in workers), 6)})
    return {"rank_steps": len(rows), "share": share,
            "gpu_idle_share": round(1 - share["compute"], 4) if rows else 0.0,
            "critical_share": shares(critical_rows(ranks)),
            "compute_lag_share": compute_lag_share(ranks),
            "queue_empty_steps": empty,
            "queue_empty_share": round(empty / len(rows), 4) if rows else 0.0,
            "max_residual": worst, "parts_add_up": worst <= ADD_UP_REL_TOL,
            "per_rank": per_rank}


def line(gw: dict[str, Any]) -> str:
    """The phase line's part: where the GPUs' time went."""
    sh, cr = gw["share"], gw["critical_share"]
    return (f"; step = data wait {sh['data_wait'] * 100:.0f}% + compute "
            f"{sh['compute'] * 100:.0f}% + exposed comm {sh['exposed_comm'] * 100:.0f}% + "
            f"barrier {sh['barrier'] * 100:.0f}% (last rank to compute: data wait "
            f"{cr['data_wait'] * 100:.0f}%, exposed comm {cr['exposed_comm'] * 100:.0f}%), "
            f"queue empty {gw['queue_empty_steps']}/{gw['rank_steps']} steps")
