"""Who made the GPUs wait: a collective phase's GPU idle time split into causes, each with
its evidence in numbers and the fix it suggests, from the phase's measurements alone.

The article's advice is to look at the job's timings, the links, the loader and the
placement *together*. What is read, per phase:

- the step's parts of each step's last rank to finish computing (``critical_share``): in a
  ring an early rank's all-reduce holds the later ranks' waits, the last rank's does not, so
  its parts say what held the step;
- the loader's own record per worker: time fetching a batch from storage against time
  preprocessing it, which splits a data wait into "storage too slow" and "CPU too slow";
- the loader flows' bytes against the rate of their storage host's link, the job's
  all-reduce time against the ideal for its bottleneck rate, drops and retransmits.

Never the phase's name, the scenario's settings or its description: a test runs this on
results with every phase renamed and the parameters removed, and must get the same causes.
Pure functions over result.json.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

#: A cause is named when it holds the GPUs for at least this share of step time: a tenth of
#: a step is what a healthy phase never reaches (healthy gpu-wait: data wait 0.04 %, the
#: all-reduce beyond its ideal under 2 %).
NAMED_MIN_SHARE = 0.10

#: What each cause suggests, in the operator's words.
FIXES = {
    "data": "feed the loaders faster: a faster or separate storage network, more storage "
            "hosts, or caching the dataset nearer the GPUs",
    "cpu": "more loader workers, lighter or offloaded preprocessing, or more CPU per GPU",
    "network": "spread the job's flows (another hash policy, pinned paths) or give the "
               "job's links the capacity its all-reduce needs",
    "straggler": "find the slow rank: its step is longer than the others' before the "
                 "all-reduce",
}


def _loader_split(details: dict[str, Any]) -> tuple[float, float, int, int]:
    """(seconds fetching, seconds preprocessing, batches, workers) over every rank's loader."""
    fetch = prep = 0.0
    batches = workers = 0
    for rk in details.get("gpu_wait", {}).get("ranks", []):
        for w in (rk.get("loader") or {}).get("per_worker") or []:
            fetch += w.get("fetch_s") or 0.0
            prep += w.get("prep_wall_s") or 0.0
            batches += w.get("batches") or 0
            workers += 1
    return fetch, prep, batches, workers


def storage_links(details: dict[str, Any]) -> list[dict[str, Any]]:
    """Per storage host (a loader flow's source): what its loader flows carried, against
    the rate of its own link in the phase, as a utilisation over the phase."""
    rate = {ln["peer"]: ln["bw_mbps"] for ln in details.get("links", [])}
    sent: dict[str, int] = {}
    for f in details.get("flows", []):
        if f.get("kind") == "loader":
            sent[f["src"]] = sent.get(f["src"], 0) + f["bytes"]
    dur = details.get("duration_s") or 0.0
    out = []
    for host, nbytes in sorted(sent.items()):
        bw = rate.get(host)
        util = nbytes * 8 / (bw * 1e6 * dur) if bw and dur else None
        out.append({"host": host, "bytes": nbytes, "bw_mbps": bw,
                    "util": round(util, 3) if util is not None else None})
    return out


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def diagnose_phase(metrics: dict[str, Any], details: dict[str, Any]) -> dict[str, Any]:
    """One phase's GPU idle time, ranked by cause (see the module's docstring)."""
    gw = metrics["gpu_wait"]
    crit = gw["critical_share"]
    idle = max(0.0, 1.0 - crit["compute"])
    fetch, prep, batches, workers = _loader_split(details)
    fetch_frac = fetch / (fetch + prep) if fetch + prep > 0 else 0.0
    step = metrics.get("step_mean_s") or 0.0
    ideal = (metrics.get("ideal_comm_s") or 0.0) / step if step else 0.0
    excess_comm = max(0.0, crit["exposed_comm"] - ideal)
    shares = {"data": crit["data_wait"] * fetch_frac,
              "cpu": crit["data_wait"] * (1.0 - fetch_frac),
              "network": excess_comm, "straggler": crit["barrier"]}
    links = storage_links(details)
    hot = [s for s in links if s["util"] is not None]
    per_batch = (lambda s: s / batches * 1000) if batches else (lambda s: 0.0)
    evidence = {
        "data": (f"data wait {_pct(crit['data_wait'])} of the step; the loaders spent "
                 f"{_pct(fetch_frac)} of their time fetching ({per_batch(fetch):.0f} ms a "
                 "batch); storage links " + ", ".join(
                     f"{s['host']} at {_pct(s['util'])} of {s['bw_mbps']:g} Mbit/s"
                     for s in hot) + f"; loader queue empty in {gw['queue_empty_steps']} of "
                 f"{gw['rank_steps']} steps"),
        "cpu": (f"data wait {_pct(crit['data_wait'])} of the step; the loaders spent "
                f"{_pct(1 - fetch_frac)} of their time preprocessing ({per_batch(prep):.0f} "
                f"ms a batch, {workers} workers in all); loader queue empty in "
                f"{gw['queue_empty_steps']} of {gw['rank_steps']} steps"),
        "network": (f"all-reduce exposed {_pct(crit['exposed_comm'])} of the step against "
                    f"{_pct(ideal)} ideal for its bottleneck; {metrics.get('drops', 0)} drops, "
                    f"{metrics.get('retransmits', 0)} retransmits"),
        "straggler": f"the last rank waited {_pct(crit['barrier'])} of the step at the barrier",
    }
    causes = sorted(({"cause": c, "share_of_step": round(v, 4),
                      "share_of_idle": round(v / idle, 4) if idle else 0.0,
                      "evidence": evidence[c], "fix": FIXES[c]}
                     for c, v in shares.items()), key=lambda x: -x["share_of_step"])
    named = [c["cause"] for c in causes if c["share_of_step"] >= NAMED_MIN_SHARE]
    return {"gpu_idle_share": round(idle, 4), "ideal_comm_share": round(ideal, 4),
            "named": named, "causes": causes, "storage_links": links}


def diagnose(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every phase with the ranks' step parts: {phase: its diagnosis}."""
    phases = result.get("metrics", {}).get("phases", {})
    details = result.get("phase_details", {})
    return {name: diagnose_phase(m, details.get(name, {}))
            for name, m in phases.items() if m.get("gpu_wait")}


def render(diagnosis: dict[str, dict[str, Any]]) -> list[str]:
    """The operator's view: per phase, the causes named, each with its evidence and fix."""
    lines = []
    for name, d in diagnosis.items():
        head = ", ".join(d["named"]) or "nothing beyond the all-reduce's own time"
        lines.append(f"{name}: GPU idle {_pct(d['gpu_idle_share'])} of the step "
                     f"(all-reduce's ideal {_pct(d['ideal_comm_share'])}); who made the GPUs "
                     f"wait: {head}")
        for c in d["causes"]:
            if c["cause"] in d["named"]:
                lines.append(f"  {c['cause']}: {_pct(c['share_of_step'])} of the step "
                             f"({_pct(c['share_of_idle'])} of idle) - {c['evidence']}")
                lines.append(f"    fix: {c['fix']}")
    return lines


# -- a result without its answers ---------------------------------------------------------

#: What a phase's metrics echo of its settings rather than measure.
SETTING_ECHOES = ("paths", "placement", "pins", "marking", "cc", "library", "program", "hosts")
#: What a loader's record echoes of its settings (its per-worker record is what it measured).
LOADER_SETTINGS = ("workers", "prefetch", "batch_bytes", "cpu_ms")


def stripped(result: dict[str, Any]) -> dict[str, Any]:
    """The result as an operator without the scenario would have it, the diagnosis's input
    contract and the who-waited exercise's: ``{"result": ..., "alias": {phase: "pN"}}``.

    Kept: the topology, the machine, and per phase its metrics and details under a new name,
    in a shuffled order seeded by the run's own measurements (so neither the order nor the
    names can be learnt from another run). Gone: the scenario's name, description and
    parameters, the lab's diagnosis, everything keyed or ordered by the phase names (the
    run's timings, its first phase, the whole-run sections), the settings a phase's metrics
    echo and the settings in each loader's record."""
    names = list(result["metrics"]["phases"])
    order = sorted(names)
    random.Random(json.dumps(result["metrics"]["phases"], sort_keys=True)).shuffle(order)
    alias = {n: f"p{i}" for i, n in enumerate(order)}
    phases = {alias[n]: {k: v for k, v in result["metrics"]["phases"][n].items()
                         if k not in SETTING_ECHOES} for n in order}
    details = {alias[n]: copy.deepcopy(result["phase_details"][n]) for n in order
               if n in result.get("phase_details", {})}
    for d in details.values():
        for rank in d.get("gpu_wait", {}).get("ranks", []):
            for key in LOADER_SETTINGS:
                (rank.get("loader") or {}).pop(key, None)
    out = {k: copy.deepcopy(result[k]) for k in ("schema", "kind", "environment", "topology")
           if k in result}
    out["metrics"] = {"phases": copy.deepcopy(phases)}
    out["phase_details"] = details
    return {"result": out, "alias": alias}
