"""Who made the GPUs wait, on real packets (scenario gpu-wait): one run, two phases.

What is checked: with ample loader workers and light preprocessing the GPUs hardly wait for
their input; with one worker whose preprocessing outlasts the step, the data wait is the
largest part of the step of each step's last rank to compute and the loader's queue is
empty at most steps, while that rank's all-reduce takes what a healthy one does. In both, every
rank's four parts add up to its step, the loader's connections are flows whose counted
bytes are the batches the ranks took (and the storage hosts served), and every link's bytes
are its flows' bytes.
"""

from __future__ import annotations

import pytest

from lab.analysis import gpuwait as diagnosis
from lab.analysis.gpuwait import stripped
from lab.grade.exercises import who_waited
from lab.kinds.collective import gpuwait
from lab.model.result import validate
from tests.integration.support import check_links_agree_with_flows, phase, run_to

#: Healthy: 0.04 % of step time waiting for data on the CI machine (the ask finds two
#: batches ready per worker); a tenth of a compute's share would already be a loader
#: falling behind.
HEALTHY_DATA_WAIT_MAX = 0.05
#: One worker, 400 ms of preprocessing per batch against a 100 ms compute: the GPUs wait
#: for about half of every step (46-60 % in eight runs). Over a third is the bound, well
#: clear of the healthy one.
CPU_DATA_WAIT_MIN = 0.35
#: The same over each step's last rank to finish computing (``critical_share``): 0.71 in
#: two runs, the early ranks' wait for it no longer counted as their all-reduce.
CPU_CRITICAL_DATA_WAIT_MIN = 0.55
#: Measured rank-steps that found the queue empty with one slow worker: 28-33 of 33 in five
#: runs (a rank held up in its all-reduce lets its worker get a batch ahead).
CPU_QUEUE_EMPTY_MIN = 0.6
#: The data phase's last rank to compute waited for data 50 % of the step in two runs
#: (its loaders fetch 64 KiB batches at a 2 Mbit/s link's pace, three workers a host).
DATA_CRITICAL_DATA_WAIT_MIN = 0.3
#: A storage link's utilisation by its loader flows over the phase: 83 % measured (the
#: phase's first and last moments have no batch in flight).
DATA_LINK_UTIL_MIN = 0.6
#: Healthy GPUs idle for the all-reduce's own time (its ideal at the bottleneck rate) and
#: at most this much more: 41 % idle against a 40 % ideal measured.
HEALTHY_IDLE_OVER_IDEAL_MAX = 0.05
#: A batch on the wire: its payload plus TCP/IP headers and the request's ACKs' share.
WIRE_OVERHEAD_MAX = 1.10


#: What each phase injects (the grader's ground truth too): the diagnosis never sees it.
INJECTED = who_waited.INJECTED


@pytest.fixture(scope="module", params=[1, 2], ids=lambda s: f"seed{s}")
def r(request, tmp_path_factory) -> dict:
    return run_to(tmp_path_factory.mktemp("gpu-wait") / "run", "gpu-wait",
                  "--seed", str(request.param), timeout=180)


def test_result_is_whole(r: dict) -> None:
    assert validate(r) == [], validate(r)
    for name in INJECTED:
        m = phase(r, name)
        assert m["errors"] == [], (name, m["errors"])
        assert m["gpu_wait"]["rank_steps"] == m["workers"] * (r["params"]["job"]["steps"]
                                                             - r["params"]["job"]["warmup"])


def test_parts_add_up_per_rank_per_step(r: dict) -> None:
    for name, details in r["phase_details"].items():
        for rank in details["gpu_wait"]["ranks"]:
            assert rank["steps"], (name, rank["rank"])
            for st in rank["steps"]:
                total = sum(st[p] for p in gpuwait.PARTS)
                assert total == pytest.approx(st["step_s"], rel=gpuwait.ADD_UP_REL_TOL), \
                    (name, rank["rank"], st)
        assert phase(r, name)["gpu_wait"]["parts_add_up"]


def test_healthy_gpus_hardly_wait_for_data(r: dict) -> None:
    gw = phase(r, "healthy")["gpu_wait"]
    assert gw["share"]["data_wait"] < HEALTHY_DATA_WAIT_MAX, gw["share"]
    assert gw["queue_empty_share"] < 0.2, gw


def test_a_slow_loader_makes_the_gpus_wait_for_data(r: dict) -> None:
    gw = phase(r, "cpu")["gpu_wait"]
    share = gw["share"]
    # Over all ranks data wait was also the largest part in eight runs, but by as little as
    # 9 points (46 % against exposed comm's 37 %): the early ranks' all-reduce holds the
    # late rank's wait. Which part held the step is the critical rank's to say.
    assert share["data_wait"] > CPU_DATA_WAIT_MIN, share
    assert gw["queue_empty_share"] > CPU_QUEUE_EMPTY_MIN, gw
    assert gw["gpu_idle_share"] > phase(r, "healthy")["gpu_wait"]["gpu_idle_share"]
    crit = gw["critical_share"]
    assert crit["data_wait"] > CPU_CRITICAL_DATA_WAIT_MIN, crit
    assert max(crit, key=crit.get) == "data_wait", crit


def test_the_critical_ranks_all_reduce_is_the_networks(r: dict) -> None:
    """The step's last rank to finish computing waits for no one to join its all-reduce:
    its exposed comm with a slow loader stays within twice the healthy ranks' (a CPU-bound
    machine slows the emulated switches too), where the early ranks' hold the data wait."""
    def mean_exposed(rows: list[dict]) -> float:
        return sum(s["exposed_comm_s"] for s in rows) / len(rows)

    healthy = [s for rk in r["phase_details"]["healthy"]["gpu_wait"]["ranks"]
               for s in rk["steps"] if not s["warmup"]]
    ranks = r["phase_details"]["cpu"]["gpu_wait"]["ranks"]
    critical = gpuwait.critical_rows(ranks)
    early = [s for rk in ranks for s in rk["steps"] if not s["warmup"] and s not in critical]
    assert mean_exposed(critical) < 2 * mean_exposed(healthy), (critical, healthy)
    assert mean_exposed(early) > mean_exposed(critical)


def test_loader_bytes_cross_the_fabric(r: dict) -> None:
    """Each loader connection's counted bytes are the batches its worker handed its rank
    (plus headers); the storage hosts served the same batches; links agree with flows."""
    for name, details in r["phase_details"].items():
        problems = check_links_agree_with_flows({**details, "topology": r["topology"]})
        assert problems == [], (name, problems)
        flows = {(f["dst_ip"], f["dport"]): f for f in details["flows"]
                 if f["kind"] == "loader"}
        ranks = details["gpu_wait"]["ranks"]
        assert len(flows) == sum(rank["loader"]["workers"] for rank in ranks)
        taken = 0
        for rank in ranks:
            assert len(rank["loader"]["per_worker"]) == rank["loader"]["workers"]
            for w in rank["loader"]["per_worker"]:
                f = flows[(w["src"], w["sport"])]
                assert w["bytes"] > 0 and len(f["path"]) == 3, (name, f["id"], f["path"])
                assert w["bytes"] <= f["bytes"] <= w["bytes"] * WIRE_OVERHEAD_MAX, \
                    (name, f["id"], f["bytes"], w["bytes"])
                taken += w["bytes"]
        served = sum(s["batch_bytes"] for s in details["gpu_wait"]["storage"].values())
        assert served == taken, (name, served, taken)


def test_a_cpu_bound_loader_leaves_the_emulation_its_cpu(r: dict) -> None:
    """The loaders' workers burn at idle priority: the cpu phase's machine has no idle
    second without counting them (0-0.5 % measured), but the emulation never waited for
    them, so with their CPU counted as idle the phase is valid - and says both numbers."""
    spare = phase(r, "cpu")["spare_work"]
    assert spare["cpu_s"] > 0, spare
    for name in INJECTED:
        m = phase(r, name)
        assert m["fidelity_valid"], (name, m["cpu_idle_min_pct"], m.get("spare_work"))
        assert m["spare_work"]["cpu_idle_min_pct_without"] <= m["cpu_idle_min_pct"]


def test_slow_storage_links_make_the_gpus_wait_for_data(r: dict) -> None:
    """The storage rack's links at 2 Mbit/s against the loaders' demand (three ranks' 64 KiB
    per step): the loaders spend their time fetching, the links run near their rate."""
    crit = phase(r, "data")["gpu_wait"]["critical_share"]
    assert crit["data_wait"] > DATA_CRITICAL_DATA_WAIT_MIN, crit
    links = diagnosis.storage_links(r["phase_details"]["data"])
    assert {s["host"] for s in links} == set(r["params"]["storage"]["hosts"])
    for s in links:
        assert s["bw_mbps"] == 2.0 and s["util"] > DATA_LINK_UTIL_MIN, links


def test_the_diagnosis_names_the_injected_cause_from_measurements_alone(r: dict) -> None:
    """Phases renamed and shuffled, settings removed: each injected cause is named first,
    and the healthy phase is named nothing; the run's own diagnosis says the same."""
    s = stripped(r)
    got = diagnosis.diagnose(s["result"])
    for name, causes in INJECTED.items():
        d = got[s["alias"][name]]
        assert d["named"][:len(causes)] == causes, (name, d["named"], d["causes"])
        assert len(d["named"]) == len(causes), (name, d["named"], d["causes"])
        assert r["diagnosis"]["gpu_wait"][name]["named"] == d["named"]
    healthy = got[s["alias"]["healthy"]]
    assert healthy["gpu_idle_share"] < HEALTHY_IDLE_OVER_IDEAL_MAX + healthy["ideal_comm_share"]


def strings(obj: object) -> set[str]:
    """Every key and string value in a JSON document."""
    if isinstance(obj, dict):
        return set(obj) | {s for v in obj.values() for s in strings(v)}
    if isinstance(obj, list):
        return {s for v in obj for s in strings(v)}
    return {obj} if isinstance(obj, str) else set()


def test_the_stripped_result_names_no_phase_and_no_setting(r: dict) -> None:
    """What the diagnosis and the who-waited exercise are given: no phase's name as a key or
    a value, nothing derived from one (the run's per-phase timings), no loader setting."""
    s = stripped(r)
    seen = strings(s["result"])
    for name in r["metrics"]["phases"]:
        assert name not in seen and f"phase_{name}_s" not in seen, name
    assert list(s["result"]["metrics"]["phases"]) == [f"p{i}" for i in range(len(s["alias"]))]
    for d in s["result"]["phase_details"].values():
        for rank in d["gpu_wait"]["ranks"]:
            assert not set(diagnosis.LOADER_SETTINGS) & set(rank["loader"]), rank["loader"]
