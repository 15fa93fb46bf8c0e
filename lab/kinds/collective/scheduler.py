"""A phase's scheduler map: which hosts run which job, and which hosts are storage.

An operator who asks why a job's GPUs waited has this from the cluster's scheduler (a
job's node list, where its pods run) and an inventory of storage servers, not from labels
the lab puts on flows. The lab exports it per phase as a scheduler would, and the GPU-wait
diagnosis (``lab.analysis.gpuwait.Scheduler``) tells whose traffic a flow is from it and
the flow's two ends alone. Jobs are named by number and hosts listed in name order, so the
map says neither the ring's order nor what a phase injected.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lab.analysis.partition import natural_key

#: The job whose ranks' steps the phase records: the one diagnosed.
DIAGNOSED = "job-1"


def _in_name_order(hosts: Iterable[str]) -> list[str]:
    return sorted(set(hosts), key=natural_key)


def scheduler_map(job_hosts: Iterable[str], other_job_hosts: Iterable[str],
                  storage_hosts: Iterable[str]) -> dict[str, Any]:
    """``{"job": the diagnosed job, "jobs": {job: hosts}, "storage": hosts}``."""
    jobs = {DIAGNOSED: _in_name_order(job_hosts)}
    other = _in_name_order(other_job_hosts)
    if other:
        jobs["job-2"] = other
    return {"job": DIAGNOSED, "jobs": jobs, "storage": _in_name_order(storage_hosts)}
