"""The DDP job without a fabric: its bad input (scenario and rank program), the overlap
arithmetic of the rank's hook timings, and the per-phase DDP metrics."""

from __future__ import annotations

import pytest

from lab import run
from lab.agents.ddprank import BLOCKS, SPLIT_BYTES, WIDTH, hidden_width, overlap_share, union_s
from lab.kinds.collective import metrics as jm
from lab.model.errors import ScenarioError
from tests.unit.test_gloo_library import refused_without_torch, refuses_before_torch


@pytest.mark.parametrize("sets, field", [
    (["job.library=synthetic"], "job.library"),
    (["job.library=nccl"], "job.library"),
    (["job.size_bytes=2097156"], "job.size_bytes"),          # whole float32s, not blocks
    (["job.workers=1"], "job.workers"),
    (["job.program=fsdp"], "job.program"),
    (["job.bucket_cap_mb=0"], "job.bucket_cap_mb"),
    (["phases.placed.job.first_bucket_mb=-1"], "phases.placed.job.first_bucket_mb"),
    (["phases.placed.job.size_bytes=1000"], "phases.placed.job.size_bytes"),
    (["job.sizes=[65536]"], "job.sizes"),
    # a loader needs a rank that waits for batches: DDP's does, gloo's bare all-reduce not
    (["phases.loader.job.program=allreduce"], "phases.loader.loader.enabled"),
    (["loader.enabled=true", "job.program=allreduce"], "loader.enabled"),
    (["phases.slow-storage.loader.workers=0"], "phases.slow-storage.loader.workers"),
    (["phases.loader.loader.prefetch=0"], "phases.loader.loader.prefetch"),
    (["storage.hosts=[h9]"], "storage.hosts"),
])
def test_bad_ddp_input_names_the_field(sets, field):
    with pytest.raises(ScenarioError) as err:
        run.check_input("ddp-train", sets=sets)
    assert err.value.field == field, str(err.value)


def test_a_ddp_phase_with_a_loader_plans_its_flows_as_the_rings():
    """The kind plans a DDP rank's loader connections as the ring's (a source port of its
    own per worker, kind ``loader``, from the storage port) and hands them to the rank."""
    from lab.kinds.collective import plan as kind
    from tests.unit.test_collective_loader import planned_for

    given = run.check_input("ddp-train")
    pp, hosts, conns = planned_for(given.params, given.topo_desc, "slow-storage")
    assert (pp["job"]["library"], pp["job"]["program"]) == ("gloo", "ddp")
    assert len(conns) == len(hosts) * pp["loader"]["workers"]
    assert {(c.spec.kind, c.spec.sport) for c in conns} == {("loader", kind.STORAGE_PORT)}
    assert len({c.spec.dport for c in conns}) == len(conns)


def test_the_scenario_checks_and_its_model_holds_exactly_s():
    given = run.check_input("ddp-train")
    size = given.params["job"]["size_bytes"]
    assert size % SPLIT_BYTES == 0
    # BLOCKS blocks of two WIDTH x m float32 matrices: exactly S bytes of gradients
    assert BLOCKS * 2 * WIDTH * hidden_width(size) * 4 == size


def test_ddp_without_torch_is_refused_before_anything_starts(monkeypatch):
    refused_without_torch(monkeypatch, "ddp-train", [])


@pytest.mark.parametrize("args, field", [
    (["--size", "1024"], "size_bytes"),
    (["--bucket-cap-mb", "0"], "bucket_cap_mb"),
    (["--first-bucket-mb", "-1"], "first_bucket_mb"),
    (["--world", "1", "--peers", "10.0.0.1"], "world"),
    # its data loader's options, checked as the ring's are
    (["--storage", "10.0.0.3:7400", "--loader-workers", "2", "--loader-sports", "7001"],
     "loader_sports"),
    (["--storage", "10.0.0.3:7400", "--loader-sports", "7001", "--prefetch", "0"],
     "prefetch"),
    (["--storage", "10.0.0.3:7400", "--loader-sports", "7001", "--batch-bytes", "0"],
     "batch_bytes"),
    (["--loader-sports", "7001"], "loader_sports"),           # no --storage to read from
])
def test_the_ddp_rank_refuses_bad_input_before_importing_torch(args, field, tmp_path):
    refuses_before_torch("ddp", {"--size": str(SPLIT_BYTES)}, args, field, tmp_path)


def test_the_ddp_rank_takes_the_rings_loader_and_live_flags():
    """One definition of the input pipeline's and the live view's flags, for both ranks;
    DDP's loader binds to its own fabric address (its ``--peers`` entry) unless told."""
    from lab.agents import worker

    args = worker.build_parser().parse_args([
        "ddp", "--rank", "1", "--world", "2", "--master", "10.0.0.1:7200",
        "--peers", "10.0.0.1,10.0.0.2", "--iface", "h2-eth0", "--size", str(SPLIT_BYTES),
        "--steps", "3", "--conns-out", "c.json", "--ready-file", "r",
        "--storage", "10.0.0.5:7400", "--loader-sports", "21000", "--batch-bytes", "4096",
        "--live-file", "l.json"])
    worker.validate_ddp(args)
    assert (args.storage, args.loader_sports, args.batch_bytes, args.live_file) == (
        [("10.0.0.5", 7400)], [21000], 4096, "l.json")
    from lab.agents.ddprank import DDPRank
    rank = DDPRank(args)
    assert rank.loader is not None and rank.loader.bind == "10.0.0.2"
    assert rank.loader.total == 3 and rank.live.file.path == "l.json"


def test_union_counts_concurrent_buckets_once():
    assert union_s([]) == 0.0
    assert union_s([(0.0, 1.0), (0.5, 1.5), (2.0, 2.5)]) == pytest.approx(2.0)
    assert union_s([(0.0, 3.0), (1.0, 2.0)]) == pytest.approx(3.0)


def test_overlap_is_the_share_of_communication_inside_backward():
    # backward computes from 1.0 to 2.0; buckets all-reduce 1.5-2.0 and 2.0-2.5
    assert overlap_share([(1.5, 2.0), (2.0, 2.5)], 1.0, 2.0) == pytest.approx(0.5)
    # one bucket, ready when backward ends: nothing to hide behind
    assert overlap_share([(2.0, 2.6)], 1.0, 2.0) == 0.0
    assert overlap_share([(1.2, 1.4)], 1.0, 2.0) == pytest.approx(1.0)
    assert overlap_share([], 1.0, 2.0) == 0.0


def _rank(rank: int, steps: list[tuple[float, float, float, float, float]]) -> dict:
    """A rank's record: per step (fwd, bwd, comm, exposed, overlap), 4 buckets of 0.5 MiB."""
    recs = []
    for k, (fwd, bwd, comm, exposed, ov) in enumerate(steps):
        recs.append({"step": k, "warmup": k == 0, "fwd_s": fwd, "bwd_s": bwd, "opt_s": 0.001,
                     "comm_s": comm, "comm_busy_s": comm, "exposed_comm_s": exposed,
                     "overlap": ov, "buckets": 4})
    return {"rank": rank, "steps": recs,
            "ddp": {"bucket_cap_mb": 0.5, "first_bucket_mb": 0.5, "grad_bytes": 2 << 20,
                    "params": 1 << 19, "buckets": 4, "bucket_bytes": [1 << 19] * 4,
                    "blocks": BLOCKS, "width": WIDTH, "hidden": 1024, "batch": 16}}


def test_ddp_metrics_over_ranks_and_measured_steps():
    r0 = _rank(0, [(0.1, 0.2, 0.9, 0.9, 0.0), (0.1, 0.2, 0.3, 0.1, 0.5),
                   (0.1, 0.2, 0.2, 0.05, 1.0)])
    r1 = _rank(1, [(0.1, 0.2, 0.9, 0.9, 0.0), (0.1, 0.4, 0.4, 0.2, 0.25),
                   (0.1, 0.2, 0.2, 0.05, 1.0)])
    d = jm.ddp_metrics([r0, r1])
    assert d["bucket_cap_mb"] == 0.5 and d["buckets"] == 4 and d["grad_bytes"] == 2 << 20
    assert [s["step"] for s in d["series"]] == [0, 1, 2] and d["series"][0]["warmup"]
    s1 = d["series"][1]
    assert s1["bwd_s"] == pytest.approx(0.3)               # mean over ranks
    assert s1["comm_s"] == 0.4 and s1["exposed_comm_s"] == 0.2   # the slowest rank's
    assert s1["overlap"] == pytest.approx(0.375)
    # Σ overlapped / Σ communication over ranks and measured steps (step 0 is warm-up)
    hidden = 0.3 * 0.5 + 0.4 * 0.25 + 0.2 + 0.2
    assert d["overlap_fraction"] == pytest.approx(hidden / (0.3 + 0.4 + 0.2 + 0.2), abs=1e-4)
    assert 0 <= d["overlap_fraction"] <= 1
    # a step some rank did not finish is not a step
    r1["steps"].pop()
    assert [s["step"] for s in jm.ddp_metrics([r0, r1])["series"]] == [0, 1]


def test_the_ddp_plot_draws_each_phase_step_part_by_part():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lab.kinds.collective.plots import run_plots
    from lab.plotting.sections import sections

    def ddp(fwd: float, bwd: float, exposed: float, buckets: int, ov: float) -> dict:
        return {"fwd_p50_s": fwd, "bwd_p50_s": bwd, "exposed_comm_p50_s": exposed,
                "comm_p50_s": 0.27, "buckets": buckets, "overlap_fraction": ov}
    result = {"metrics": {"phases": {"placed": {"ddp": ddp(0.11, 0.21, 0.11, 8, 0.6)},
                                     "one-bucket": {"ddp": ddp(0.11, 0.21, 0.29, 1, 0.0)}}},
              "phase_details": {"placed": {}, "one-bucket": {}}}
    specs = {s.name: s for s in run_plots(result, sections(result)) if hasattr(s, "draw")}
    spec = specs["ddp-steps"]
    assert spec.vmax == pytest.approx(610.0)            # the longest step, in ms
    fig = plt.figure()
    caption = spec.draw(fig, spec.vmax)
    labels = [t.get_text() for t in fig.axes[0].texts]
    plt.close(fig)
    assert labels == ["8 buckets, 60% overlapped", "1 bucket, 0% overlapped"]
    assert "placed: all-reduce 270 ms, 110 exposed" in caption
    # a run without DDP has no such plot
    assert all(getattr(s, "name", "") != "ddp-steps"
               for s in run_plots({"metrics": {}}, sections({"metrics": {}})))
