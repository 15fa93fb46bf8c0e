"""The job-aware policy and the other job's keys, without a network: announced jobs get
disjoint ports, everything else is hashed exactly as hash5 hashes it, and a bad other job is
one error naming its field before anything starts."""

from __future__ import annotations

import pytest

from controllers.policies import get
from controllers.policies.base import FlowKey
from lab import run
from lab.model.errors import ScenarioError


def key(i: int, sport: int = 20000) -> FlowKey:
    return FlowKey(f"10.0.0.{i}", f"10.0.0.{i + 1}", 6, sport + i, 7100 + i)


def test_announced_jobs_leave_by_disjoint_ports_both_ways() -> None:
    policy = get("job-aware")(seed=3)
    jobs = {key(i): "job1" for i in range(1, 5)} | {key(i): "job2" for i in range(6, 10)}
    policy.observe_jobs(jobs)
    for ports in ([3, 4], [3, 4, 5]):
        for k, job in jobs.items():
            want = ports[0] if job == "job1" else ports[1]
            assert policy.choose(k, "leaf2", ports) == want
            assert policy.choose(k.reversed(), "spine1", ports) == want   # its ACKs too


def test_what_no_job_owns_is_hashed_as_hash5_hashes_it() -> None:
    aware, hash5 = get("job-aware")(seed=7), get("hash5")(seed=7)
    aware.observe_jobs({key(1): "job1"})
    for i in range(2, 200):
        assert aware.choose(key(i, 30000), "leaf1", [5, 6, 7]) == \
            hash5.choose(key(i, 30000), "leaf1", [5, 6, 7])
    aware.observe_jobs({})              # a phase that announces nothing: hash5 for all
    assert aware.choose(key(1), "leaf1", [5, 6]) == hash5.choose(key(1), "leaf1", [5, 6])


@pytest.mark.parametrize("sets, field, words", [
    (["phases.two-jobs.other_job.hosts=[h7]"], "phases.two-jobs.other_job.hosts",
     "at least two"),
    (["phases.two-jobs.other_job.hosts=[h7, h7]"], "phases.two-jobs.other_job.hosts",
     "named twice"),
    (["phases.two-jobs.other_job.hosts=[h7, h99]"], "phases.two-jobs.other_job.hosts",
     "no host 'h99'"),
    (["phases.two-jobs.other_job.hosts=[h7, h11]"], "phases.two-jobs.other_job.hosts",
     "storage host"),
    # the job's six ranks are h1-h6: two jobs on one host
    (["phases.two-jobs.other_job.hosts=[h6, h7]"], "phases.two-jobs.other_job.hosts",
     "two jobs on one host"),
    (["phases.two-jobs.other_job.baseline=nowhere"], "phases.two-jobs.other_job.baseline",
     "'nowhere'"),
    (["phases.two-jobs.other_job.baseline=job-aware"],
     "phases.two-jobs.other_job.baseline", "runs alone"),
    (["phases.racks.other_job.announce=true"], "phases.racks.other_job.announce",
     "no other job"),
])
def test_a_bad_other_job_names_the_field(sets: list[str], field: str, words: str) -> None:
    with pytest.raises(ScenarioError) as err:
        run.make_plans("gpu-wait", sets=sets)
    assert err.value.field == field, str(err.value)
    assert words in str(err.value)


def test_announcing_jobs_needs_a_job_aware_policy() -> None:
    with pytest.raises(ScenarioError) as err:
        run.make_plans("gpu-wait", policy="hash5")
    assert err.value.field == "phases.job-aware.other_job.announce", str(err.value)
    assert "not job-aware" in str(err.value)
