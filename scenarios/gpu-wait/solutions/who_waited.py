"""Solution: who made the GPUs wait, per phase, from the ranks' steps and the loaders' records.

1. The step that matters is the one of the rank that finished computing last: in a ring an
   early rank's all-reduce cannot end before the late rank joins, so the early ranks' exposed
   comm holds the late rank's wait; the late rank's own parts say what held the step. Sum
   each part of that rank over the measured steps and divide by their step time.
2. Its data wait is the loaders': split it by what the loaders' workers spent their time on,
   fetching a batch from storage (``data``: the storage links are too slow) or preprocessing
   it (``cpu``: too few workers or too much work per batch).
3. The all-reduce's ideal scales with 1/its bottleneck's rate. Placed in one rack (when some
   rack has enough hosts that are not storage) its bottleneck would be the hosts' own NICs:
   the rest of its ideal is the ``placement``'s - or the ``interface``'s, when its
   connections ran off the fabric (their ``interface`` is not ``fabric``).
4. Its exposed comm and barrier beyond the ideal are the ``network``'s - or ``other-job``'s,
   when the busiest link it shared carried mostly another job's flows. Whose a flow is
   comes from its two ends and the scheduler's map (``whose``).
5. The other ranks waited, inside their all-reduce, for however much longer that rank
   computed than the step's median rank: a ``straggler``'s, when one rank computes 1.2x
   longer than the fastest all along.
6. Name a cause when it holds at least 15 % of the step, the largest first.

``fabriclab diagnose`` does the same (lab/analysis/gpuwait.py) and says so with its evidence.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

EXERCISE = "who-waited"     # `fabriclab grade` finds the exercise by this line

#: A cause holding the GPUs for less than this share of the step is noise: a healthy step
#: waits 0.04 % for data and spends under 3 % beyond the all-reduce's ideal, and beside
#: another job on links of its own, up to 11 % (the emulator's shared CPU); an injected
#: cause holds 29 % or more.
NAMED_MIN_SHARE = 0.15
PARTS = ("data_wait", "compute", "exposed_comm", "barrier")


def critical_share(details: dict[str, Any]) -> dict[str, float]:
    """Each part's share of the step of each measured step's last rank to finish computing,
    and ``lag``: how much longer it computed than the step's median rank."""
    ranks = details["gpu_wait"]["ranks"]
    by_step: dict[int, list[dict[str, Any]]] = {}
    for rank in ranks:
        for s in rank["steps"]:
            if not s["warmup"] and s.get("t_compute_end") is not None:
                by_step.setdefault(s["step"], []).append(s)
    steps = [rows for rows in by_step.values() if len(rows) == len(ranks)]
    last = [max(rows, key=lambda s: s["t_compute_end"]) for rows in steps]
    total = sum(s["step_s"] for s in last)
    share = {p: sum(s[f"{p}_s"] for s in last) / total if total else 0.0 for p in PARTS}
    lag = sum(max(0.0, s["compute_s"] - statistics.median(r["compute_s"] for r in rows))
              for s, rows in zip(last, steps, strict=True))
    return share | {"lag": lag / total if total else 0.0}


def fetching_share(details: dict[str, Any]) -> float:
    """The loaders' time spent fetching batches, against fetching plus preprocessing them."""
    fetch = prep = 0.0
    for rank in details["gpu_wait"]["ranks"]:
        for w in rank["loader"]["per_worker"]:
            fetch += w["fetch_s"]
            prep += w["prep_wall_s"]
    return fetch / (fetch + prep) if fetch + prep else 0.0


def whose(flow: dict[str, Any], scheduler: dict[str, Any]) -> str:
    """``job`` (between two of the job's hosts), ``data`` (between the job and storage),
    ``other-job`` (between two hosts of one other job) or ``none``."""
    jobs = scheduler["jobs"]
    mine, storage = set(jobs[scheduler["job"]]), set(scheduler["storage"])
    ends = {flow["src"], flow["dst"]}
    if ends <= mine:
        return "job"
    if ends & mine and ends & storage:
        return "data"
    if any(ends <= set(hosts) for j, hosts in jobs.items() if j != scheduler["job"]):
        return "other-job"
    return "none"


def best_bottleneck_mbps(topology: dict[str, Any], details: dict[str, Any]) -> float:
    """The slowest link the job's ring would cross placed as well as the fabric allows."""
    hosts = set(details["scheduler"]["jobs"][details["scheduler"]["job"]])
    storage = set(details["scheduler"]["storage"])
    roles = {sw["name"]: sw["role"] for sw in topology["switches"]}
    free: dict[str, int] = {}
    nic, uplink = [], []
    for ln in topology["links"]:
        if roles.get(ln["b"]) == "leaf" and ln["a"] not in roles:   # a host's NIC
            free[ln["b"]] = free.get(ln["b"], 0) + (ln["a"] not in storage)
            if ln["a"] in hosts:
                nic.append(ln["bw_mbps"])
        elif roles.get(ln["a"]) == "leaf" and roles.get(ln["b"]) == "spine":
            uplink.append(ln["bw_mbps"])
    fits = len(hosts) <= max(free.values(), default=0)
    return min(nic) if fits else min(min(nic), min(uplink))


def busiest_other(details: dict[str, Any], topology: dict[str, Any]) -> str | None:
    """Of the links the all-reduce crossed, the one where other flows had the largest share
    of a busy link: whose flows carried most there (None: nothing else did)."""
    rate = {}
    for ln in topology["links"]:                 # the links' rates as built, both ways
        rate[(ln["a"], ln["b"])] = rate[(ln["b"], ln["a"])] = ln["bw_mbps"]
    util = {(ln["node"], ln["peer"]): ln["tx_bytes"] * 8 / (rate[(ln["node"], ln["peer"])]
                                                          * 1e6 * details["duration_s"])
            for ln in details["links"] if (ln["node"], ln["peer"]) in rate}
    on: dict[tuple[str, str], dict[str, int]] = {}
    mine = set()
    for f in details["flows"]:
        hops = [*f["path"], f["dst"]]
        for a, b in itertools.pairwise(hops):
            if (a, b) in util:
                kinds = on.setdefault((a, b), {})
                who = whose(f, details["scheduler"])
                kinds[who] = kinds.get(who, 0) + f["hop_bytes"].get(a, 0)
                if who == "job":
                    mine.add((a, b))
    best, score = None, 0.0
    for link in mine:
        total = sum(on[link].values())
        other = {k: v for k, v in on[link].items() if k != "job" and v}
        if total and other and (s := sum(other.values()) / total * util[link]) > score:
            best, score = max(other, key=other.get), s
    return best


def compute_spread(details: dict[str, Any]) -> float:
    """The slowest rank's mean compute over the fastest's."""
    means = [sum(s["compute_s"] for s in r["steps"] if not s["warmup"])
             / max(1, sum(1 for s in r["steps"] if not s["warmup"]))
             for r in details["gpu_wait"]["ranks"]]
    return max(means) / min(means) if means and min(means) > 0 else 1.0


def causes(metrics: dict[str, Any], details: dict[str, Any],
           topology: dict[str, Any]) -> list[str]:
    """One phase's causes, the largest first; [] when nothing but the all-reduce's own time."""
    crit = critical_share(details)
    fetching = fetching_share(details)
    ideal = metrics["ideal_comm_s"] / metrics["step_mean_s"] if metrics["step_mean_s"] else 0.0
    placed = ideal * metrics["bottleneck_bps"] / 1e6 / best_bottleneck_mbps(topology, details)
    gap = max(0.0, min(crit["exposed_comm"], ideal) - placed)
    off_fabric = any(f.get("interface", "fabric") != "fabric" for f in details["flows"]
                     if whose(f, details["scheduler"]) == "job")
    straggler = crit["lag"] if compute_spread(details) > 1.2 else 0.0
    beyond = max(0.0, crit["exposed_comm"] + crit["barrier"] - ideal)
    other_job = busiest_other(details, topology) == "other-job"
    shares = {"data": crit["data_wait"] * fetching,
              "cpu": crit["data_wait"] * (1.0 - fetching),
              "placement": 0.0 if off_fabric else gap, "interface": gap if off_fabric else 0.0,
              "network": 0.0 if other_job else beyond, "other-job": beyond if other_job else 0.0,
              "straggler": straggler}
    return sorted((c for c, v in shares.items() if v >= NAMED_MIN_SHARE),
                  key=lambda c: -shares[c])


def who_waited(result: dict[str, Any]) -> dict[str, list[str]]:
    """{phase: its causes} for every phase of the result."""
    return {name: causes(m, result["phase_details"][name], result["topology"])
            for name, m in result["metrics"]["phases"].items()}


if __name__ == "__main__":
    for phase, named in who_waited(json.loads(Path(sys.argv[1]).read_text())).items():
        print(f"{phase}: {', '.join(named) or 'nothing beyond the all-reduce'}")
