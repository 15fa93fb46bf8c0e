"""PFC's head-of-line blocking on real packets: the ``pfc-hol`` scenario (the roce kind).

Three RoCE senders on leaf2 write into h1 on leaf1; a victim QP from leaf2 goes to h2 and
never crosses h1's port. One run, four phases, each checked on its own counters:

- lossy (no PFC): h1's port (and no host's NIC) drops in the lossless class and go-back-N
  resends windows, so the incast delivers less than with PFC;
- PFC: the lossless class drops nothing anywhere, the pauses reach at least two hops
  upstream of h1's port (which is the only root), and the victim loses most of its rate,
  while a TCP flow in the lossy class, through the same paused ports, keeps its rate;
- ECN + DCQCN (with PFC): the ports spend at least 5 times less time paused, and the victim
  gets its rate back (it joins an incast DCQCN has already slowed).

Every path is the one the switches counted, and each data-direction link's bytes are its
flows' bytes. ``fabriclab diagnose`` names h1's port as the pauses' root and the victim as
held by ports paused for someone else.
"""

from __future__ import annotations

import json

import pytest

from lab.analysis import diagnose
from lab.model.result import validate
from tests.integration.support import fabriclab, phase, result_of

#: The victim under PFC: below this share of its rate alone.
HOL_SHARE = 0.70
#: What h5's lossy class sends while its lossless class is paused, as a share of the NIC's
#: rate (measured 0.80: 19.9 of 25 Mbit/s; the paused class still gets its leak).
OTHER_CLASS_KEPT = 0.5
#: ECN + DCQCN cuts the time ports spend paused by at least this factor ...
PAUSE_CUT = 5.0
#: ... and the victim is back within this share of its rate alone.
RECOVERED = 0.10
#: A data-direction link's bytes against its flows' (headers counted alike on both sides).
LINK_TOL = 0.02


@pytest.fixture(scope="module")
def hol(shared_run) -> dict:
    return result_of(shared_run("pfc-hol"))


def test_diagnose_names_the_root_of_the_pauses_and_their_victim(shared_run) -> None:
    """``fabriclab diagnose --phase pfc``: the pauses' root is h1's port, and the victim is
    named as held by ports paused for the incast, with those ports as evidence."""
    out = fabriclab("diagnose", str(shared_run("pfc-hol")), "--phase", "pfc", "--json")
    p = json.loads(out.stdout)["pauses"]
    assert p["roots"] == ["leaf1-eth1"]
    assert p["victims"] == ["victim-h8"]
    assert p["flows"]["victim-h8"]["paused_ports"] and not p["flows"]["victim-h8"]["roots"]
    for f in ("incast-h5", "incast-h6", "incast-h7"):
        assert p["flows"][f]["roots"] == ["leaf1-eth1"]
    text = fabriclab("diagnose", str(shared_run("pfc-hol")), "--phase", "pfc").stdout
    assert "pauses: root leaf1-eth1" in text and "victim-h8 at " in text


def test_the_result_is_valid_and_every_qp_took_one_counted_path(hol: dict) -> None:
    assert validate(hol) == []
    assert hol["fidelity"]["valid"], hol["fidelity"]["notes"]
    for name, d in hol["phase_details"].items():
        for f in d["flows"]:
            assert f["path_clean"] and f["path"][0] == "leaf2" and f["path"][-1] == "leaf1", \
                (name, f["id"], f["path"])


def test_data_links_carry_exactly_their_flows_bytes(hol: dict) -> None:
    """leaf2 -> spine and spine -> leaf1 carry the QPs' data and nothing else (their ACKs
    and CNPs go the other way): each link's bytes are its flows' bytes."""
    for name, d in hol["phase_details"].items():
        r = {"topology": hol["topology"], **d}
        balance = diagnose.link_balance(r)
        for ln in d["links"]:
            if (ln["node"], ln["peer"][:5]) not in (("leaf2", "spine"),) and \
                    not (ln["node"].startswith("spine") and ln["peer"] == "leaf1"):
                continue
            arrived = balance.get(f"{ln['node']}->{ln['peer']}", {}).get("arrived", 0)
            assert abs(ln["tx_bytes"] - arrived) <= LINK_TOL * max(ln["tx_bytes"], 1) + 3000, \
                (name, ln["node"], ln["peer"], ln["tx_bytes"], arrived)


def test_lossy_drops_and_go_back_n_delivers_less_than_pfc(hol: dict) -> None:
    lossy, pfc = phase(hol, "lossy"), phase(hol, "pfc")
    assert lossy["lossless_drops"] > 0
    assert "leaf1-eth1" in lossy["lossless_drops_by_port"]
    # a NIC never drops what it has not sent: the hosts' queues hold back (roce_bw stops
    # at a full NIC queue), only switch ports drop
    hosts = {h["name"] for h in hol["topology"]["hosts"]}
    assert not any(dev.split("-")[0] in hosts for dev in lossy["lossless_drops_by_port"])
    assert lossy["groups"]["incast"]["retransmitted"] > 0
    assert lossy["groups"]["incast"]["goodput_bps"] < pfc["groups"]["incast"]["goodput_bps"]


def test_pfc_drops_nothing_and_its_pauses_spread_upstream(hol: dict) -> None:
    pfc = phase(hol, "pfc")
    assert pfc["lossless_drops"] == 0
    tree = pfc["pause_tree"]
    assert tree["roots"] == ["leaf1-eth1"]
    assert tree["max_hops"] >= 2
    assert any(h >= 2 for dev, h in tree["hops"].items() if dev.startswith("leaf2"))
    assert pfc["pause_frames"] > 0


def test_the_victim_waits_behind_the_incast_under_pfc(hol: dict) -> None:
    victim = phase(hol, "pfc")["groups"]["victim"]
    assert victim["vs_baseline"] is not None and victim["vs_baseline"] < HOL_SHARE, victim
    # the victim's own path is never h1's port: its packets were held, not dropped
    for f in hol["phase_details"]["pfc"]["flows"]:
        if f["kind"] == "victim":
            assert f["dst"] == "h2" and f["loss"] == 0.0


def test_dcqcn_cuts_the_pauses_and_the_victim_recovers(hol: dict) -> None:
    pfc, dcqcn = phase(hol, "pfc"), phase(hol, "dcqcn")
    assert dcqcn["lossless_drops"] == 0
    assert dcqcn["ce_marked"] > 0 and dcqcn["groups"]["incast"]["cnps"] > 0
    assert dcqcn["pause_time_s"] * PAUSE_CUT <= pfc["pause_time_s"], (dcqcn["pause_time_s"],
                                                                        pfc["pause_time_s"])
    victim = dcqcn["groups"]["victim"]
    assert victim["vs_baseline"] is not None and victim["vs_baseline"] >= 1 - RECOVERED, victim


def test_the_lossy_class_keeps_flowing_through_paused_ports(hol: dict) -> None:
    """PFC pauses one priority: while h5's NIC's lossless class was held, its lossy class
    (the bulk TCP flow to h3) kept sending - pfcd counts the port's other classes' bytes
    over exactly the paused time - at most of the NIC's rate."""
    pfc = phase(hol, "pfc")
    assert pfc["groups"]["bulk"]["transport"] == "tcp" and pfc["groups"]["bulk"]["goodput_bps"]
    h5 = next(p["priorities"]["3"] for p in hol["phase_details"]["pfc"]["pfc"]["ports"]
              if p["dev"] == "h5-eth0")
    assert h5["paused_ns"] > 0
    rate_bps = h5["other_bytes_while_paused"] * 8 / (h5["paused_ns"] / 1e9)
    nic_bps = hol["topology"]["params"]["host_bw"] * 1e6
    assert rate_bps >= OTHER_CLASS_KEPT * nic_bps, (rate_bps, nic_bps)
