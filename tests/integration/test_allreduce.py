"""GPUs waiting for the network, on real packets: ring All-Reduce under ECMP, placement and
shared storage links. One real `fabriclab run` per scenario feeds each group of checks.

What is checked is the story a class would be told, with the numbers that prove it: on an
uncongested fabric the ring runs at the rate the arithmetic predicts; a hash collision slows
every GPU's step; a placement without collisions removes it; a topology-blind scheduler
crosses more links and is slower; a checkpoint sharing the GPUs' links slows exactly the
steps it overlaps, and a class of its own gives the ring its time back. Every path is the
one the switches counted, and every link's bytes are its flows' bytes.
"""

from __future__ import annotations

import itertools

import pytest

from controllers.marking import tcp_wire_ceiling_bps
from lab.model.result import validate
from tests.integration.support import (
    IDEAL_TOL,
    check_links_agree_with_flows,
    phase,
    result_of,
    run_to,
)


def run(tmp_path_factory, scenario: str) -> dict:
    return run_to(tmp_path_factory.mktemp(scenario) / "run", scenario)


@pytest.fixture(scope="module")
def ecmp(shared_run) -> dict:
    return result_of(shared_run("allreduce-ecmp"))


@pytest.fixture(scope="module")
def placement(tmp_path_factory) -> dict:
    return run(tmp_path_factory, "allreduce-placement")


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict:
    return run(tmp_path_factory, "allreduce-shared-link")


def check_common(r: dict) -> None:
    """Schema, fidelity, and every claim about paths and bytes, in every phase."""
    assert validate(r) == [], validate(r)
    assert r["fidelity"]["valid"], r["fidelity"]
    for key in ("workers", "size_bytes", "steps", "step_p50_s", "step_p99_s", "comm_p50_s",
                "gpu_idle_fraction", "algbw_bps", "busbw_bps", "ideal_comm_s", "step_series"):
        assert key in r["metrics"], key
    for ln in r["links"]:
        assert "ce_marked" in ln and "queue_bytes" in ln["series"]
        assert len(ln["series"]["queue_bytes"]) == len(ln["series"]["t"])
    for name, details in r["phase_details"].items():
        m = phase(r, name)
        n = m["workers"]
        assert m["errors"] == [], (name, m["errors"])
        # nccl-tests: algbw = S / t, busbw = algbw · 2(N−1)/N
        assert m["algbw_bps"] == pytest.approx(m["size_bytes"] * 8 / m["comm_p50_s"], rel=1e-3)
        assert m["busbw_bps"] == pytest.approx(m["algbw_bps"] * 2 * (n - 1) / n, rel=1e-3)
        assert m["ideal_comm_s"] == pytest.approx(
            2 * (n - 1) / n * m["size_bytes"] * 8 / tcp_wire_ceiling_bps(m["bottleneck_bps"]),
            rel=1e-3)
        ring = [f for f in details["flows"] if f["kind"] == "allreduce"]
        assert ring and all(f["path_clean"] and f["bytes"] > 0 for f in ring), name
        problems = check_links_agree_with_flows({**details, "topology": r["topology"]})
        assert not problems, (name, problems)
        # queue occupancy sampled at >= 20 Hz
        t = details["links"][0]["series"]["t"]
        assert len(t) >= 20 * details["duration_s"] * 0.8, (name, len(t))


def test_allreduce_ecmp_results_are_sound(ecmp):
    check_common(ecmp)
    assert ecmp["metrics"]["workers"] == 8 and ecmp["phase"] == "hashed"


def test_a_placed_ring_runs_at_the_ideal_rate(ecmp):
    m = phase(ecmp, "placed")
    assert all(not e["collided"] for e in m["epochs"].values()), m["epochs"]
    assert abs(m["comm_p50_s"] / m["ideal_comm_s"] - 1) <= IDEAL_TOL, m
    assert m["busbw_bps"] >= (1 - IDEAL_TOL) * m["bottleneck_bps"]
    print(f"placed: comm {m['comm_p50_s'] * 1000:.0f} ms vs ideal "
          f"{m['ideal_comm_s'] * 1000:.0f} ms, busbw {m['busbw_bps'] / 1e6:.1f} Mbit/s")


def test_pins_are_the_paths_packets_took(ecmp):
    details = ecmp["phase_details"]["placed"]
    flows = {f["id"]: f for f in details["flows"]}
    up = {(ln["a"], ln["a_port"]): ln["b"] for ln in ecmp["topology"]["links"]}
    pins = phase(ecmp, "placed")["pins"]
    assert len(pins) == len([f for f in flows.values() if f["kind"] == "allreduce"])
    for p in pins:
        f = flows[p["flow"]]
        assert f["path"][:2] == [p["switch"], up[(p["switch"], p["port"])]], (p, f["path"])


def test_collisions_slow_every_gpu_and_placement_removes_it(ecmp):
    hashed, placed = phase(ecmp, "hashed"), phase(ecmp, "placed")
    sharing = {int(k): v for k, v in hashed["by_link_sharing"].items()}
    print("hashed, step p50 by connections on the busiest link:",
          {k: v["step_p50_s"] for k, v in sharing.items()}, "placed:", placed["step_p50_s"])
    assert max(sharing) >= 2, "no epoch collided: nothing to show"
    # More connections on one link, slower steps - for every rank (the step is the job's).
    levels = sorted(sharing)
    for lo, hi in itertools.pairwise(levels):
        assert sharing[hi]["step_p50_s"] > sharing[lo]["step_p50_s"] * 1.1, sharing
    collided = hashed["by_collision"]["collided"]
    assert collided["step_p50_s"] > placed["step_p50_s"] * 1.3
    assert collided["gpu_idle_fraction"] > placed["gpu_idle_fraction"] + 0.05
    assert hashed["retransmits"] > placed["retransmits"]


def test_placement_scattered_crosses_more_links_and_is_slower(placement):
    check_common(placement)
    packed, scattered = phase(placement, "packed"), phase(placement, "scattered")
    print(f"packed {packed['hosts']}: {packed['links_crossed']} links, step "
          f"{packed['step_p50_s']:.3f} s; scattered {scattered['hosts']}: "
          f"{scattered['links_crossed']} links, step {scattered['step_p50_s']:.3f} s")
    assert packed["links_crossed"] < scattered["links_crossed"]
    assert abs(packed["comm_p50_s"] / packed["ideal_comm_s"] - 1) <= IDEAL_TOL
    # The scattered job's connections share oversubscribed uplinks; the packed one's never.
    assert max(e["max_flows_per_link"] for e in packed["epochs"].values()) == 1
    assert max(e["max_flows_per_link"] for e in scattered["epochs"].values()) >= 2
    assert scattered["step_p50_s"] > packed["step_p50_s"] * 1.2
    assert scattered["gpu_idle_fraction"] > packed["gpu_idle_fraction"]


def test_checkpoints_slow_the_steps_they_overlap_and_classes_fix_it(shared):
    check_common(shared)
    alone, same, classes = (phase(shared, n) for n in ("alone", "shared", "classes"))
    during = same["by_checkpoint"]["during"]
    outside = same["by_checkpoint"]["outside"]
    print(f"alone {alone['step_p50_s']:.3f} s; shared: during checkpoints "
          f"{during['step_p50_s']:.3f} s ({during['steps']} steps), outside "
          f"{outside['step_p50_s']:.3f} s; classes {classes['step_p50_s']:.3f} s "
          f"p99 {classes['step_p99_s']:.3f} s")
    assert during["steps"] > 0 and outside["steps"] > 0
    # Every GPU checkpoints at once, so two GPUs share a storage server's link: a checkpoint
    # takes at most half a GPU's NIC, and an all-reduce it overlaps whole takes twice as
    # long (0.32 -> 0.64 s; a step of 0.25 s compute then 1.55x). The all-reduce, not the
    # step, is what the checkpoint acts on: a step it overlaps in part is diluted by compute.
    # Measured, all-reduce during / outside: 1.64x (step 1.36x; 1.20-1.35x over six runs
    # before links counted wire bytes).
    assert during["comm_p50_s"] > outside["comm_p50_s"] * 1.3
    assert during["step_p50_s"] > outside["step_p50_s"]
    # The tail is a step overlapped whole: the model's 1.55x, measured 1.53x, then 1.45x and
    # 1.50x in two fresh clones (1.25-1.52x over six runs before links counted wire bytes).
    # Without the checkpoint's effect the two tails are the same steps: 1.0x.
    assert same["step_p99_s"] > alone["step_p99_s"] * 1.2
    assert same["gpu_idle_fraction"] > alone["gpu_idle_fraction"]
    # In a class of its own the checkpoint still runs (every phase wrote checkpoints) ...
    assert classes["checkpoints"] and all(c["duration_s"] > 0 for c in classes["checkpoints"])
    # ... and the steps it overlaps (slower, it overlaps most) are back to the job alone's:
    # the job's class is guaranteed 95 % of the NIC and borrows the rest first, so its
    # all-reduce slows by 1/0.95 at most, its step by 3 % (measured 0.98-1.05x, 1.03x after
    # links counted wire bytes); the ring's tail below the shared one's (measured 0.69-0.96x).
    # Not the tail against the job alone: p99 of 23 steps is their slowest, and one
    # retransmission timeout in either phase decides it (1 run in 7 here).
    c_during = classes["by_checkpoint"]["during"]
    assert c_during["steps"] > 0
    assert c_during["step_p50_s"] < alone["step_p50_s"] * 1.1
    assert c_during["step_p50_s"] < during["step_p50_s"]
    assert classes["step_p99_s"] < same["step_p99_s"]
    storage = [f for f in shared["phase_details"]["shared"]["flows"]
               if f["kind"].startswith("storage")]
    assert storage and all(f["bytes"] > 0 for f in storage)
