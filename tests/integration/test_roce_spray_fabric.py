"""A sprayed QP on the lab's fabric (the roce kind's ``roce.spray``): its packets take both
spines, each entropy value's 5-tuple watched on the switches like a flow of its own.

The fabric: 2 leaves x 2 spines, a host's NIC at 40 Mbit/s and each fabric link at 25, so
one path cannot carry a QP and two can. One QP from h1 to h3, with PFC (nothing dropped):

- one path (no spraying): the QP gets one uplink's rate;
- sprayed over 32 ports, out-of-order placement: both uplinks carry it, and it gets more;
- sprayed, RC's go-back-N receiver: the reordering the two queues make, as it counts it.

Each phase's data-direction links agree with its flows' bytes, and every subflow keeps one
clean path.
"""

from __future__ import annotations

import pytest

from lab.analysis import diagnose
from lab.model.result import validate
from tests.integration.support import phase, run_scenario

SCENARIO = """
name: spray-check
kind: roce
policy: hash5
seed: 1
duration: 4
topology: {type: leafspine, spines: 2, leaves: 2, hosts_per_leaf: 2, host_bw: 40,
           fabric_bw: 25}
flows:
  - {group: qp, from: [h1], to: h3}
pfc: {enabled: true}
phases:
  one-path:
    roce: {spray: 1}
  sprayed:
    roce: {spray: 32, placement: ooo}
  sprayed-gbn:
    roce: {spray: 32, placement: gbn}
"""
#: Sprayed, the QP gets at least this much more than on one path (two paths: up to 40/25).
SPRAY_GAIN = 1.3
#: Each of leaf1's uplinks carries at least this share of a sprayed QP's bytes.
LEAST_SHARE = 0.3
#: A data-direction link's bytes against its flows' (as in test_pfc_hol).
LINK_TOL = 0.02


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("spray")
    path = tmp / "spray-check.yaml"
    path.write_text(SCENARIO)
    return run_scenario(tmp, str(path))


def uplink_bytes(r: dict, name: str) -> dict[str, int]:
    """Bytes of the QP's 5-tuples (its own and its subflows') per spine, as leaf1's
    switch counted them."""
    out: dict[str, int] = {}
    for f in r["phase_details"][name]["flows"]:
        if f["src"] == "h1" and f["path"][:1] == ["leaf1"]:
            spine = f["path"][1]
            out[spine] = out.get(spine, 0) + f["hop_bytes"]["leaf1"]
    return out


def test_spraying_spreads_one_qp_over_both_spines(run: dict) -> None:
    one = phase(run, "one-path")["groups"]["qp"]
    sprayed = phase(run, "sprayed")["groups"]["qp"]
    gbn = phase(run, "sprayed-gbn")["groups"]["qp"]
    spread = {n: uplink_bytes(run, n) for n in ("one-path", "sprayed", "sprayed-gbn")}
    print(f"\ngoodput one path {one['goodput_bps']}, sprayed ooo {sprayed['goodput_bps']} "
          f"(placed out of order {sprayed['placed_out_of_order']}), sprayed gbn "
          f"{gbn['goodput_bps']} (out of sequence {gbn['out_of_sequence']}, "
          f"retransmitted {gbn['retransmitted']}); spines {spread}")
    assert len(spread["one-path"]) == 1
    total = sum(spread["sprayed"].values())
    assert len(spread["sprayed"]) == 2 and all(
        b >= LEAST_SHARE * total for b in spread["sprayed"].values()), spread["sprayed"]
    assert sprayed["goodput_bps"] > SPRAY_GAIN * one["goodput_bps"]
    assert sprayed["retransmitted"] == 0 and sprayed["out_of_sequence"] == 0
    for name in ("one-path", "sprayed", "sprayed-gbn"):
        assert phase(run, name)["lossless_drops"] == 0, name


def test_every_subflow_keeps_one_path_and_data_links_carry_their_bytes(run: dict) -> None:
    """32 5-tuples, each on one clean path; leaf1 -> spine and spine -> leaf2 carry the
    QP's data and nothing else (its ACKs go the other way): each of those links' bytes are
    its flows' bytes."""
    assert validate(run) == []
    d = run["phase_details"]["sprayed"]
    subflows = [f for f in d["flows"] if f["id"].startswith("qp-h1")]
    assert len(subflows) == 32 and len({f["sport"] for f in subflows}) == 32
    assert all(f["path_clean"] and f["bytes"] > 0 for f in subflows)
    for name, details in run["phase_details"].items():
        balance = diagnose.link_balance({"topology": run["topology"], **details})
        for ln in details["links"]:
            if not ((ln["node"] == "leaf1" and ln["peer"].startswith("spine")) or
                    (ln["node"].startswith("spine") and ln["peer"] == "leaf2")):
                continue
            arrived = balance.get(f"{ln['node']}->{ln['peer']}", {}).get("arrived", 0)
            assert abs(ln["tx_bytes"] - arrived) <= LINK_TOL * max(ln["tx_bytes"], 1) + 3000, \
                (name, ln["node"], ln["peer"], ln["tx_bytes"], arrived)
