"""allreduce-spray on real packets: allreduce-ecmp's ring of eight on RoCE, hashed, placed
and sprayed.

Eight ``roce_ring`` ranks in two racks, every hop across one of 4 spines, each QP at its
NIC's line rate: the placed ring fills every uplink exactly. Seed 1's per-QP hash puts two
QPs on one uplink in each direction, and the ring runs at that hop's half rate. Sprayed,
each QP's packets take 256 source ports in turn, every 5-tuple is watched as a flow, and
the switches' hash spreads every QP over every spine; the receivers place out of order.
"""

from __future__ import annotations

import pytest

from lab.model.result import validate
from tests.integration.support import check_links_agree_with_flows, phase, result_of

#: The sprayed ring's step against the placed ring's: at most this factor. Hashing 2,048
#: 5-tuples onto 4 spines splits them 1.02-1.03 of even, and every uplink is full when
#: placed, so the busiest one queues: 1.09 in two runs (docs/kinds/collective.md).
SPRAYED_OVER_PLACED = 1.15
#: The hashed ring's step against the placed one's: at least this factor (two QPs on an
#: uplink halve that hop; 1.92 measured).
HASHED_OVER_PLACED = 1.5
SPRAY = 256
QPS = 8


@pytest.fixture(scope="module")
def r(shared_run) -> dict:
    return result_of(shared_run("allreduce-spray"))


def qp_of(f: dict) -> str:
    return f.get("subflow_of") or f["id"]


def test_every_phase_is_valid_and_its_links_carry_its_flows_bytes(r: dict) -> None:
    assert validate(r) == []
    for name, d in r["phase_details"].items():
        m = phase(r, name)
        assert m["fidelity_valid"] and m["transport"] == "roce", name
        assert m["lossless_drops"] == 0 and m["errors"] == [], (name, m["errors"])
        assert check_links_agree_with_flows({"topology": r["topology"], **d}) == [], name
        for f in d["flows"]:
            assert f["path_clean"] and f["proto"] == "udp" and f["dport"] == 4791, f


def test_the_hash_collides_and_placement_does_not(r: dict) -> None:
    hashed, placed = phase(r, "hashed"), phase(r, "placed")
    assert hashed["epochs"]["0"]["collided"] and not placed["epochs"]["0"]["collided"]
    assert len(placed["pins"]) == QPS
    assert hashed["step_p50_s"] > HASHED_OVER_PLACED * placed["step_p50_s"], \
        (hashed["step_p50_s"], placed["step_p50_s"])


def test_every_sprayed_qp_takes_every_spine_and_is_placed_out_of_order(r: dict) -> None:
    m, flows = phase(r, "sprayed"), r["phase_details"]["sprayed"]["flows"]
    assert m["spray"] == {"ports": SPRAY, "receivers": "ooo"}
    by_qp: dict[str, list[dict]] = {}
    for f in flows:
        by_qp.setdefault(qp_of(f), []).append(f)
    assert len(by_qp) == QPS and all(len(fs) == SPRAY for fs in by_qp.values())
    spines = {s["name"] for s in r["topology"]["switches"] if s["name"].startswith("spine")}
    for qp, fs in by_qp.items():
        assert {f["path"][1] for f in fs if f["bytes"]} == spines, qp
        assert len({f["sport"] for f in fs}) == SPRAY, qp
    assert m["split"]["imbalance"] < 1.1, m["split"]
    assert m["reordering"]["placed_out_of_order"] > 0, m["reordering"]
    assert m["reordering"]["out_of_sequence"] == 0, m["reordering"]    # nothing NAKed
    assert not phase(r, "placed")["reordering"]["placed_out_of_order"]


def test_spraying_brings_the_step_near_the_placed_rings(r: dict) -> None:
    hashed, placed, sprayed = (phase(r, n) for n in ("hashed", "placed", "sprayed"))
    print("step p50: hashed", hashed["step_p50_s"], "placed", placed["step_p50_s"],
          "sprayed", sprayed["step_p50_s"])
    assert sprayed["step_p50_s"] <= SPRAYED_OVER_PLACED * placed["step_p50_s"], \
        (sprayed["step_p50_s"], placed["step_p50_s"])
    assert hashed["step_p50_s"] > sprayed["step_p50_s"] * 1.3
