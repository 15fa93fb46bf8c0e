"""``job-aware``: the jobs the lab announces each get their own uplinks; everything else is
hashed like ``hash5``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from controllers.policies.base import FlowKey, HashPolicy, pack_5tuple, pick, seeded_crc


class JobAware(HashPolicy):
    """Job-aware path pinning: flows of different training jobs never share an uplink.

    A per-flow hash is blind to which job a flow belongs to, so two jobs' all-reduces can
    meet on one spine uplink and each run at half its pace (Crux, SIGCOMM'24: a third of a
    production cluster's jobs suffered such contention). Here the lab tells the controller
    each job's connections (its ``jobs`` request, both directions of each); with J jobs
    sorted by id, job i leaves every multi-path switch by candidate port i mod P, so up to
    P jobs get disjoint spines end to end. Flows of no announced job are hashed as ``hash5``
    hashes them, so a phase that announces nothing runs exactly as hash5 would.

    The decision is a pure function of the flow, the switch's candidates and the jobs table
    the lab set before announcing the flows, so the controller may take it ahead.
    """

    name = "job-aware"
    granularity = "flow"
    decides_ahead = True

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self._job_of: dict[FlowKey, str] = {}
        self._rank: dict[str, int] = {}

    def observe_jobs(self, jobs: Mapping[FlowKey, str]) -> None:
        """Replace the table of which flow belongs to which job (both directions)."""
        self._job_of = {}
        for key, job in jobs.items():
            self._job_of[key] = job
            self._job_of[key.reversed()] = job
        self._rank = {job: i for i, job in enumerate(sorted(set(jobs.values())))}

    def choose(self, flow: FlowKey, switch: str, ports: Sequence[int]) -> int:
        job = self._job_of.get(flow)
        if job is None:
            return pick(ports, seeded_crc(pack_5tuple(flow), self.seed))
        return pick(ports, self._rank[job])
