"""A ring rank's data loader in the collective kind, without a network: its keys and their
checks, its planned connections, and the step's parts read back from the ranks' records."""

from __future__ import annotations

import random

import pytest

from lab import run
from lab.kinds.collective import gpuwait
from lab.kinds.collective import plan as kind
from lab.kinds.collective.programs import loader_args
from lab.kinds.collective.setup import JobSetup
from lab.model.errors import ScenarioError
from lab.net.topologies import describe, make_topology

TOPO = {"type": "leafspine", "spines": 2, "leaves": 3, "hosts_per_leaf": 4}


def topo():
    return describe(make_topology(TOPO))


@pytest.mark.parametrize("sets, field", [
    (["loader.enabled=true", "loader.workers=0"], "loader.workers"),
    (["phases.alone.loader.prefetch=0"], "phases.alone.loader.prefetch"),
    (["loader.cpu_ms=-1"], "loader.cpu_ms"),
    (["loader.batch_bytes=0"], "loader.batch_bytes"),
    (["loader.enabled=maybe"], "loader.enabled"),
    # the loader reads from storage hosts: none named is an error, also with storage off
    (["loader.enabled=true", "storage.hosts=[]", "phases.shared.storage.mode='off'",
      "phases.classes.storage.mode='off'"], "storage.hosts"),
    (["storage.hosts=[h99]"], "storage.hosts"),
    # the synthetic ring's and DDP's ranks are the ones that wait for batches
    (["phases.alone.loader.enabled=true", "job.pattern=incast"], "phases.alone.loader.enabled"),
    (["loader.enabled=true", "job.library=gloo"], "loader.enabled"),
    (["phases.alone.loader.enabled=true", "phases.alone.job.library=gloo"],
     "phases.alone.loader.enabled"),
    # a slow storage link needs storage hosts to slow, and a rate
    (["storage.hosts=[]", "storage.mode='off'", "phases.shared.storage.mode='off'",
      "phases.classes.storage.mode='off'", "storage.link_mbps=2"], "storage.link_mbps"),
    (["phases.alone.storage.link_mbps=-1"], "phases.alone.storage.link_mbps"),
])
def test_bad_loader_input_names_the_field(sets, field):
    with pytest.raises(ScenarioError) as err:
        run.make_plans("allreduce-shared-link", sets=sets)
    assert err.value.field == field, str(err.value)


def test_loader_is_off_unless_asked():
    """Every scenario that does not name the loader runs its ring as before."""
    for pp in kind.check({}, topo()).values():
        assert pp["loader"]["enabled"] is False
    pp = kind.check({"storage": {"hosts": ["h12"]}, "loader": {"enabled": True},
                     "phases": {"a": {}, "b": {"loader": {"workers": 1, "cpu_ms": 80}}}},
                    topo())
    assert pp["a"]["loader"]["workers"] == kind.DEFAULTS["loader"]["workers"]
    assert (pp["b"]["loader"]["workers"], pp["b"]["loader"]["cpu_ms"]) == (1, 80)
    assert pp["b"]["loader"]["enabled"] is True


def job_setup(t: dict) -> JobSetup:
    """``JobSetup`` as a run holds it, enough to plan connections on topology ``t``."""
    setup = JobSetup()
    setup.ips = {h["name"]: h["ip"] for h in t["hosts"]}
    setup.sports = random.Random(1).sample(range(20000, 32000), 200)
    setup.next_index = 0
    return setup


def planned_for(params: dict, t: dict, name: str = "run"):
    """Phase ``name`` of a scenario's ``params``: its parameters, placed hosts and its
    loaders' connections as ``JobSetup`` plans them."""
    pp = kind.check(params, t)[name]
    hosts = kind.place_workers(t, pp, random.Random(1))
    return pp, hosts, job_setup(t).loader_conns(pp, hosts)


def planned(loader: dict, workers: int = 3):
    """A phase's ring and loader connections as ``JobSetup`` plans them."""
    t = topo()
    pp = kind.check({"job": {"workers": workers, "size_bytes": 3 * 1024},
                     "storage": {"hosts": ["h11", "h12"]}, "loader": loader}, t)["run"]
    setup = job_setup(t)
    hosts = kind.place_workers(t, pp, random.Random(1))
    ring = setup.conns_for(pp, hosts)
    return pp, hosts, ring, setup.loader_conns(pp, hosts)


def test_each_loader_worker_has_a_planned_connection_of_its_own():
    pp, hosts, ring, conns = planned({"enabled": True, "workers": 2})
    assert len(conns) == 3 * 2
    ports = [c.spec.dport for c in conns] + [c.spec.sport for c in ring]
    assert len(set(ports)) == len(ports)                 # one 5-tuple, one connection
    assert len({c.index for c in ring + conns}) == len(ring + conns)   # own counter cookies
    for r, h in enumerate(hosts):
        mine = [c for c in conns if c.rank == r]
        # batches flow from the storage host to the rank, from the storage port
        assert {(c.spec.dst, c.spec.sport, c.spec.kind) for c in mine} == {
            (h, kind.STORAGE_PORT, "loader")}
        # worker i of rank r reads from storage host (r + i) mod S
        assert [c.spec.src for c in mine] == [["h11", "h12"][(r + i) % 2] for i in range(2)]
        argv = loader_args(pp, mine)
        opts = dict(zip(argv[::2], argv[1::2], strict=True))
        assert opts["--storage"] == ",".join(f"{c.spec.src_ip}:{kind.STORAGE_PORT}"
                                             for c in mine)
        assert opts["--loader-sports"] == ",".join(str(c.spec.dport) for c in mine)
        assert opts["--loader-workers"] == "2"


def test_no_loader_no_connections_no_options():
    pp, _, _, conns = planned({})
    assert conns == [] and loader_args(pp, conns) == []


def rank_record(rank: int, steps: list[tuple[float, float, float, float]],
                empty: list[bool]) -> dict:
    """A ring rank's JSON as the agent writes it, for steps of (data wait, compute, exposed
    comm, barrier) seconds; step 0 is warm-up."""
    recs, t = [], 100.0
    for k, ((dw, c, ec, b), e) in enumerate(zip(steps, empty, strict=True)):
        recs.append({"step": k, "warmup": k == 0, "data_wait_s": dw, "compute_s": c,
                     "exposed_comm_s": ec, "barrier_s": b,
                     "step_s": round(dw + c + ec + b, 6), "t_start": t,
                     "t_compute_end": t + dw + c,
                     "batch": {"queue_depth": 0 if e else 2}})
        t += dw + c + ec + b
    return {"rank": rank, "steps": recs,
            "loader": {"queue_empty_steps": sum(empty), "data_wait_s": sum(s[0] for s in steps),
                       "per_worker": [{"bytes": 65536 * len(steps), "prep_cpu_s": 0.3,
                                       "prep_wall_s": 0.4}]}}


def test_shares_are_time_weighted_over_measured_steps():
    outs = [rank_record(r, [(9.0, 0.1, 0.1, 0.0), (0.3, 0.1, 0.1, 0.0),
                            (0.1, 0.1, 0.1, 0.1)], [True, True, False]) for r in range(2)]
    gw = gpuwait.summary(gpuwait.rank_details(outs))
    assert gw["rank_steps"] == 4                         # warm-up (the 9 s wait) left out
    # Σ over 2 ranks of steps 1-2: data wait 0.8, compute 0.4, comm 0.4, barrier 0.2 of 1.8
    assert gw["share"] == pytest.approx({"data_wait": 0.4444, "compute": 0.2222,
                                         "exposed_comm": 0.2222, "barrier": 0.1111}, abs=1e-4)
    assert gw["gpu_idle_share"] == pytest.approx(1 - 0.2222, abs=1e-4)
    assert gw["queue_empty_steps"] == 2 and gw["queue_empty_share"] == 0.5
    assert gw["parts_add_up"] and gw["max_residual"] < 1e-5
    assert gw["per_rank"][1]["batch_bytes"] == 3 * 65536


def test_parts_that_do_not_add_up_are_reported():
    out = rank_record(0, [(0.1, 0.1, 0.1, 0.0), (0.1, 0.1, 0.1, 0.0)], [False, False])
    out["steps"][1]["step_s"] = 0.35                     # 50 ms nobody accounts for
    gw = gpuwait.summary(gpuwait.rank_details([out]))
    assert not gw["parts_add_up"] and gw["max_residual"] == pytest.approx(0.05 / 0.35,
                                                                          rel=1e-4)


def test_the_critical_rank_is_the_last_to_finish_computing():
    """An early rank's exposed comm holds the late rank's data wait; the late rank's parts
    say what held the step."""
    early = rank_record(0, [(0.0, 0.1, 0.1, 0.0), (0.1, 0.1, 0.4, 0.0)], [False, True])
    late = rank_record(1, [(0.0, 0.1, 0.1, 0.0), (0.4, 0.1, 0.1, 0.0)], [False, True])
    gw = gpuwait.summary(gpuwait.rank_details([early, late]))
    assert gw["share"]["data_wait"] == pytest.approx(0.5 / 1.2, abs=1e-4)
    assert gw["critical_share"] == pytest.approx({"data_wait": 0.6667, "compute": 0.1667,
                                                  "exposed_comm": 0.1667, "barrier": 0.0},
                                                 abs=1e-4)
    assert "(last rank to compute: data wait 67%, exposed comm 17%)" in gpuwait.line(gw)


def test_the_others_wait_for_a_slow_ranks_compute_in_no_rank_of_its_own_parts():
    """A rank that computes 0.3 s where the others compute 0.1 s: they wait for it inside
    their all-reduce; it is the step's last to compute, its own parts show no wait, and the
    lag (its compute less the median rank's) is the others' wait, a share of its step."""
    fast = [rank_record(r, [(0.0, 0.1, 0.1, 0.0), (0.0, 0.1, 0.3, 0.0)], [False, False])
            for r in range(2)]
    slow = rank_record(2, [(0.0, 0.1, 0.1, 0.0), (0.0, 0.3, 0.1, 0.0)], [False, False])
    gw = gpuwait.summary(gpuwait.rank_details([*fast, slow]))
    assert gw["critical_share"]["exposed_comm"] == pytest.approx(0.25, abs=1e-4)
    assert gw["compute_lag_share"] == pytest.approx(0.2 / 0.4, abs=1e-4)
    same = gpuwait.summary(gpuwait.rank_details(fast))
    assert same["compute_lag_share"] == 0.0
