"""The weathermap's PFC pauses: each direction whose egress port PFC paused (pfcd's
counters in a phase's details) carries its paused seconds; a port that sent PAUSE but was
never paused itself (the congested root) and a port of another priority carry none."""

from __future__ import annotations

from lab.plotting.weathermap import Arc, with_pauses


def _port(dev: str, prio: str, tx: int, rx: int, ns: int) -> dict:
    return {"dev": dev, "priorities": {prio: {"pause_frames_tx": tx, "pause_frames_rx": rx,
                                              "paused_ns": ns}}}


def test_paused_egress_ports_carry_their_seconds() -> None:
    arcs = [Arc("spine1", "leaf1", 0, 1, 50.0, 40.0), Arc("leaf1", "h1", 0, 1, 25.0, 95.0),
            Arc("h5", "leaf2", 0, 0, 25.0, None), Arc("leaf2", "spine1", 0, 5, 50.0, 10.0)]
    details = {"pfc": {"ports": [
        _port("spine1-eth1", "3", 10, 20, 2_500_000_000),
        _port("leaf1-eth1", "3", 40, 0, 0),                 # the root: never paused
        _port("h5-eth0", "3", 0, 30, 3_100_000_000),
        _port("leaf2-eth5", "4", 0, 5, 1_000_000_000)]}}    # another priority
    out = {(a.src, a.dst): a.paused_s for a in with_pauses(arcs, details)}
    assert out == {("spine1", "leaf1"): 2.5, ("leaf1", "h1"): 0.0, ("h5", "leaf2"): 3.1,
                   ("leaf2", "spine1"): 0.0}


def test_without_pfc_the_arcs_are_unchanged() -> None:
    arcs = [Arc("leaf1", "h1", 0, 1, 25.0, 95.0)]
    assert with_pauses(arcs, {}) is arcs
    assert with_pauses(arcs, {"pfc": None}) is arcs
