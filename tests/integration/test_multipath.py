"""multipath on real packets: ecmp-one-pair's collision on a lossless fabric, then sprayed.

Four RoCE QPs, one per host, from one leaf to the other across 4 spines, each at 80 % of
its link: seed 2's per-flow hash puts two on one uplink. Sprayed over 256 source ports a
QP, the switches' own hash spreads every QP over every spine. The split is checked against
the policy's prediction for the very ports sprayed, and the receivers' counters show the
reordering spraying costs: RC's go-back-N receiver takes it for loss, out-of-order
placement does not.
"""

from __future__ import annotations

from pathlib import Path

from tests.integration.support import phase, run_to


def _sum(m: dict, key: str) -> float:
    return sum(g[key] for g in m["groups"].values())


def test_spraying_evens_the_uplinks_and_placement_pays_for_the_reordering(
        tmp_path: Path) -> None:
    r = run_to(tmp_path / "out", "multipath")
    hashed, gbn, ooo = (phase(r, n) for n in ("hashed", "sprayed-gbn", "sprayed-ooo"))
    for name, m in (("hashed", hashed), ("sprayed-gbn", gbn), ("sprayed-ooo", ooo)):
        assert m["lossless_drops"] == 0, name
        print(name, m["split"], _sum(m, "goodput_bps") / 1e6, _sum(m, "out_of_sequence"),
              _sum(m, "placed_out_of_order"), _sum(m, "retransmitted"))
    assert hashed["split"]["imbalance"] > 1.3                   # the collision
    for m in (gbn, ooo):                                        # the spray, as predicted
        assert abs(m["split"]["imbalance"] - m["split"]["predicted_imbalance"]) < 0.05
    assert ooo["split"]["imbalance"] <= 1.10                    # within 10 % of the mean
    assert _sum(gbn, "out_of_sequence") > 0 and _sum(ooo, "placed_out_of_order") > 0
    assert _sum(ooo, "out_of_sequence") == 0
    assert _sum(ooo, "goodput_bps") > 1.5 * _sum(gbn, "goodput_bps")
    assert _sum(ooo, "goodput_bps") > _sum(hashed, "goodput_bps")
