"""Another job on the same fabric: a second synthetic ring all-reduce beside the phase's job.

Crux (SIGCOMM'24) measured that a third of the jobs of a 2,000-GPU cluster lost time to
other jobs' traffic on shared links. The other job runs the lab's own ring on
``other_job.hosts`` (in that ring order), starts ``other_job.alone_s`` before the phase's
job, so its own steps alone are measured on the same clock as its steps beside it, and is
stopped when the phase's job ends. Its connections are flows of kind ``other-job``. With
``other_job.collide`` its hops leaving a rack the job's ring also leaves are pinned onto
that ring hop's uplink (the meeting a per-flow hash makes by chance, made certain); with
``other_job.announce`` the lab tells the controller which job each connection is, for a
job-aware policy (``controllers/policies/job_aware.py``) to give each job its own uplinks.
"""

from __future__ import annotations

import copy
from typing import Any

from lab.kinds.collective.plan import Conn, ring_conns
from lab.model.stats import percentile

#: Steps asked of the other job: more than it can take before it is stopped.
OTHER_STEPS = 100_000
#: The job ids the lab announces: the phase's job, then the other one.
JOB_IDS = ("job1", "job2")


def job_params(pp: dict[str, Any]) -> dict[str, Any]:
    """The other job's parameters: the phase's with its own ring and no loader, storage,
    elephants or interface of its own."""
    oj = pp["other_job"]
    out = copy.deepcopy(pp)
    out["job"].update(workers=len(oj["hosts"]), size_bytes=oj["size_bytes"],
                      compute_s=oj["compute_s"], steps=OTHER_STEPS, warmup=1, jitter_s=0.0,
                      straggler_rank=-1, straggler_s=0.0, epoch_steps=0, buckets=1, sizes=[],
                      interface="fabric")
    out["loader"]["enabled"] = False
    return out


def conns(pp: dict[str, Any], ips: dict[str, str], sports: list[int],
          next_index: int) -> list[Conn]:
    """The other job's ring connections, counted like the job's, of kind ``other-job``."""
    hosts = pp["other_job"]["hosts"]
    if not hosts:
        return []
    out = ring_conns(hosts, ips, job_params(pp)["job"], sports, next_index)
    for c in out:
        c.spec.kind = "other-job"
        c.spec.id = f"o{c.spec.id}"
    return out


def announced(job: list[Conn], other: list[Conn]) -> list[dict[str, Any]]:
    """The ``jobs`` request's flows: each connection's 5-tuple and its job's id."""
    return [{"proto": 6, "src": c.spec.src_ip, "dst": c.spec.dst_ip, "sport": c.spec.sport,
             "dport": c.spec.dport, "job": jid}
            for jid, cs in zip(JOB_IDS, (job, other), strict=True) for c in cs]


def summary(outputs: list[dict[str, Any]], t_job_start: float | None,
            t_job_end: float | None) -> dict[str, Any]:
    """The other job's step time alone (steps that ended before the phase's job started)
    and beside the job (steps inside the job's run), from its ranks' own clocks (rank 0's
    steps: a ring's ranks step together)."""
    steps = [s for s in (outputs[0].get("steps") or []) if isinstance(s, dict)
             and not s.get("warmup") and s.get("t_end") is not None] if outputs else []
    alone = [s["step_s"] for s in steps if t_job_start is not None and s["t_end"] <= t_job_start]
    beside = [s["step_s"] for s in steps if t_job_start is not None and t_job_end is not None
              and s["t_end"] - s["step_s"] >= t_job_start and s["t_end"] <= t_job_end]
    a = percentile(alone, 50) if alone else None
    b = percentile(beside, 50) if beside else None
    return {"steps_alone": len(alone), "steps_beside": len(beside),
            "step_p50_alone_s": round(a, 4) if a is not None else None,
            "step_p50_beside_s": round(b, 4) if b is not None else None,
            "slowdown": round(b / a, 3) if a and b else None,
            "errors": [o["error"] for o in outputs if o.get("error")
                       and o["error"] != "stopped by SIGTERM"]}
