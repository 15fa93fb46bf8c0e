"""The model against the library, on real packets: the lab's synthetic ring and PyTorch's
gloo All-Reduce phase beside phase on one fabric (scenario allreduce-gloo: allreduce-ecmp's
GPUs, fabric, seed and placement).

What is checked: gloo's own connections are found after rendezvous and become flows whose
paths the switches counted, whose bytes are the links' bytes, and whose pins (placed) are
the paths their packets took; gloo runs a ring (the bytes say so, one connection per rank
pair); uncongested and placed, neither beats the wire's bound 2(N-1)/N·S/B, the lab's ring
runs within 25 % of it and gloo within 20 % of the lab's ring; hashing slows both.
"""

from __future__ import annotations

import json

import pytest

from controllers.marking import tcp_wire_ceiling_bps
from lab.model.result import validate
from tests.integration.support import IDEAL_TOL, check_links_agree_with_flows, phase, run_to

#: Placed and uncongested, the library's all-reduce is within this of the lab's ring on the
#: same fabric (measured 1.0-1.08 on two days, while the distance of both from
#: the bound moved from 1.05 to 1.3 with the machine: docs/fidelity.md).
MODEL_TOL = 0.20
#: A measured time may fall short of the bound by no more than the clocks' granularity.
BOUND_SLACK = 0.98


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> dict:
    return run_to(tmp_path_factory.mktemp("allreduce-gloo") / "run", "allreduce-gloo",
                  timeout=400)


def test_every_phase_is_sound_and_its_flows_are_the_links_bytes(both):
    assert validate(both) == [], validate(both)
    assert both["fidelity"]["valid"], both["fidelity"]
    for name, details in both["phase_details"].items():
        m = phase(both, name)
        assert m["errors"] == [], (name, m["errors"])
        assert m["library"] == name.split("-")[0].replace("ring", "synthetic")
        ring = [f for f in details["flows"] if f["kind"] == "allreduce"]
        # one outgoing ring hop per rank per epoch, each counted on its whole path
        assert len(ring) == m["workers"] * len(m["epochs"]), (name, len(ring))
        assert all(f["path_clean"] and f["bytes"] > 0 for f in ring), name
        problems = check_links_agree_with_flows({**details, "topology": both["topology"]})
        assert not problems, (name, problems)


def test_gloos_connections_are_a_ring_one_per_rank_pair(both):
    for name in ("gloo-hashed", "gloo-placed"):
        g = phase(both, name)["gloo"]
        print(name, json.dumps(g))
        assert g["torch"] and g["algorithm"] == "ring"
        assert g["seen"]["algorithm"] == "ring", g["seen"]
        pairs = g["connections_per_pair"]
        # Every one of the 8 ranks' 28 pairs connected exactly once per epoch (a new
        # process group each epoch), and nothing else connected.
        epochs = len(phase(both, name)["epochs"])
        assert pairs == {"min": 1, "max": 1, "pairs": 28, "epochs": epochs,
                         "total": 28 * epochs}, pairs
        mesh = [f for f in both["phase_details"][name]["flows"] if f["kind"] == "gloo-mesh"]
        assert len(mesh) == pairs["total"] - 8 * pairs["epochs"]


def test_gloos_pins_are_the_paths_its_packets_took(both):
    details = both["phase_details"]["gloo-placed"]
    flows = {f["id"]: f for f in details["flows"]}
    up = {(ln["a"], ln["a_port"]): ln["b"] for ln in both["topology"]["links"]}
    m = phase(both, "gloo-placed")
    assert len(m["pins"]) == len([f for f in flows.values() if f["kind"] == "allreduce"])
    for p in m["pins"]:
        f = flows[p["flow"]]
        assert f["path"][:2] == [p["switch"], up[(p["switch"], p["port"])]], (p, f["path"])
    assert all(not e["collided"] for e in m["epochs"].values()), m["epochs"]


def test_the_model_and_the_library_agree_placed_and_move_together_hashed(both):
    ring_h, ring_p = phase(both, "ring-hashed"), phase(both, "ring-placed")
    gloo_h, gloo_p = phase(both, "gloo-hashed"), phase(both, "gloo-placed")
    ideal = ring_p["ideal_comm_s"]
    assert gloo_p["ideal_comm_s"] == pytest.approx(ideal)   # gloo runs a ring: same formula
    print(f"placed comm: ring {ring_p['comm_p50_s'] * 1000:.0f} ms, gloo "
          f"{gloo_p['comm_p50_s'] * 1000:.0f} ms, ideal {ideal * 1000:.0f} ms; hashed step "
          f"p50: ring {ring_h['step_p50_s'] * 1000:.0f} ms, gloo "
          f"{gloo_h['step_p50_s'] * 1000:.0f} ms")
    for m in (ring_p, gloo_p):
        assert m["comm_p50_s"] >= ideal * BOUND_SLACK, m["comm_p50_s"]   # nothing beats the wire
    assert abs(ring_p["comm_p50_s"] / ideal - 1) <= IDEAL_TOL, ring_p["comm_p50_s"]
    assert abs(gloo_p["comm_p50_s"] / ring_p["comm_p50_s"] - 1) <= MODEL_TOL
    # Hashing collides both on the spines, and both slow down.
    assert max(e["max_flows_per_link"] for e in gloo_h["epochs"].values()) >= 2
    assert max(e["max_flows_per_link"] for e in ring_h["epochs"].values()) >= 2
    for hashed, placed in ((ring_h, ring_p), (gloo_h, gloo_p)):
        assert hashed["step_p50_s"] > placed["step_p50_s"] * 1.1
        assert hashed["gpu_idle_fraction"] > placed["gpu_idle_fraction"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[dict, object]:
    out = tmp_path_factory.mktemp("allreduce-sweep") / "run"
    return run_to(out, "allreduce-sweep", timeout=400), out


#: From 4 MiB on, both libraries run within this of TCP's ceiling on the wire (measured
#: 0.97-0.985 over ten runs: every wire of the ring also carries the other hop's ACKs, one
#: 90-byte frame per TSO packet of 4, 1.5 %); from 1 MiB on, within this of each other.
#: A size's time is the median of three steps: one gloo step with a loss recovery (0.72-0.77
#: s against 0.64 s at 2 MiB, fast retransmits, no timeout) moved a median of two by 10 %.
LARGE_TOL = 0.10


def test_the_sweep_is_nccl_tests_table_for_both_libraries(sweep):
    """The curve nccl-tests draws on a real network: no size beats the wire (a port counts
    every frame's wire bytes, lab/net/wire.py), and large messages run at TCP's ceiling on
    it, with the synthetic ring where gloo is."""
    r, out = sweep
    assert validate(r) == [], validate(r)
    assert r["fidelity"]["valid"], r["fidelity"]
    sizes = r["params"]["job"]["sizes"]
    busbw = {}
    for name in ("synthetic", "gloo"):
        m = phase(r, name)
        assert m["errors"] == [] and m["library"] == name
        rows = m["sweep"]
        assert [row["size_bytes"] for row in rows] == sizes
        n, bw = m["workers"], m["bottleneck_bps"]
        ceiling = tcp_wire_ceiling_bps(bw)
        for row in rows:
            assert row["count"] == row["size_bytes"] // 4 and row["steps"] == 3
            assert row["algbw_bps"] == pytest.approx(row["size_bytes"] * 8 / row["time_s"],
                                                     rel=1e-3)
            assert row["busbw_bps"] == pytest.approx(row["algbw_bps"] * 2 * (n - 1) / n,
                                                     rel=1e-3)
            assert row["ideal_busbw_bps"] == pytest.approx(ceiling, abs=1)
            assert row["busbw_vs_ideal"] == pytest.approx(row["busbw_bps"] / ceiling, abs=1e-3)
            assert row["busbw_bps"] <= ceiling, (name, row)
            if row["size_bytes"] >= 4 << 20:
                assert row["busbw_bps"] >= ceiling * (1 - LARGE_TOL), (name, row)
        busbw[name] = {row["size_bytes"]: row["busbw_bps"] for row in rows}
        problems = check_links_agree_with_flows({**r["phase_details"][name],
                                                 "topology": r["topology"]})
        assert not problems, (name, problems)
        print(name, [(row["size_bytes"], round(row["busbw_bps"] / 1e6, 2),
                      row["busbw_vs_ideal"]) for row in rows])
    for size in sizes:
        if size >= 1 << 20:
            ring, gloo = busbw["synthetic"][size], busbw["gloo"][size]
            assert abs(ring / gloo - 1) <= LARGE_TOL, (size, ring, gloo)
    assert (out / "plots" / "allreduce-sweep.png").stat().st_size > 10_000


def test_regress_checks_a_gloo_variant_before_any_fabric_starts():
    """`fabriclab regress --set library=gloo` is accepted; a bad library is refused first."""
    from lab.model.errors import ScenarioError
    from lab.regress import validate_inputs
    validate_inputs(["allreduce-ecmp"], ["hash5"], ["library=gloo"], None)
    with pytest.raises(ScenarioError) as err:
        validate_inputs(["allreduce-ecmp"], ["hash5"], ["library=nccl"], None)
    assert err.value.field == "job.library"


def test_the_fabric_fixture_holds_a_policy_against_gloo(fabric):
    """A user's test, as `lab.testing` documents it, on the real library."""
    r = fabric.run("allreduce-ecmp", policy="hash5",
                   sets=["library=gloo", "job.steps=8", "phases.placed.job.steps=4"])
    res = r.results[0]
    hashed, placed = res["metrics"]["phases"]["hashed"], res["metrics"]["phases"]["placed"]
    assert hashed["library"] == placed["library"] == "gloo"
    assert hashed["gloo"]["seen"]["algorithm"] == "ring"
    assert r.valid
    # what regress holds a policy to, per hashed phase, from the real library's steps
    assert r.metric("hashed.step_p99_s").values == [hashed["step_p99_s"]]
    assert hashed["step_p99_s"] > placed["step_p99_s"]
