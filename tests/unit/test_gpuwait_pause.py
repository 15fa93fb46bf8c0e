"""The GPU-wait diagnosis's pause cause on made-up measurements, without root: a four-rank
RoCE ring whose flows cross ports PFC paused under a root they never cross (an incast into
h1 from leaf2's other hosts), its all-reduce well beyond its ideal.

A phase here is what the roce fabric's result holds: pfcd's counters per port for the
lossless priority, which ports feed which, the flows with their 5-tuples and paths, and the
scheduler's map; on pfc-hol's leaf-spine (two leaves of four hosts, 25 Mbit/s host links,
50 Mbit/s uplinks). The incast's pauses spread as pfc-hol's did: h1's port (leaf1-eth1) is
the root, the spines' ports towards leaf1 and leaf1's other hosts' NICs are paused one hop
up, leaf2's uplinks two, leaf2's hosts' NICs three.
"""

from __future__ import annotations

from typing import Any

import pytest

from lab.analysis import gpuwait
from lab.kinds.collective.scheduler import scheduler_map
from lab.model.flows import ROCE_UDP_PORT
from lab.net.topologies import describe, make_topology

TOPO = describe(make_topology({"type": "leafspine", "spines": 2, "leaves": 2,
                               "hosts_per_leaf": 4, "host_bw": 25, "fabric_bw": 50}))
#: The ring: two ranks on each leaf, none of them h1, the incast's receiver.
RING = ["h2", "h3", "h6", "h7"]
#: The incast: leaf2's two other hosts into h1, hosts of no job.
INCAST = [("h5", "h1"), ("h8", "h1")]
ROOT = "leaf1-eth1"
MB = 1_000_000
S = 1_000_000_000

#: Every watched port and the ports that feed it, as PFC was configured.
FEEDERS = {"leaf1-eth1": ["spine1-eth1", "spine2-eth1", "h2-eth0", "h3-eth0", "h4-eth0"],
           "spine1-eth1": ["leaf2-eth5"], "spine2-eth1": ["leaf2-eth6"],
           "leaf2-eth5": ["h5-eth0", "h6-eth0", "h7-eth0", "h8-eth0"],
           "leaf2-eth6": ["h5-eth0", "h6-eth0", "h7-eth0", "h8-eth0"]}
#: Seconds each port was paused: the root none (it sent PAUSE, it received none).
PAUSED_S = {"spine1-eth1": 3.0, "spine2-eth1": 2.6, "h2-eth0": 1.2, "h3-eth0": 1.1,
            "h4-eth0": 0.4, "leaf2-eth5": 2.4, "leaf2-eth6": 2.2, "h5-eth0": 2.0,
            "h6-eth0": 1.5, "h7-eth0": 1.6, "h8-eth0": 1.9}


def route(a: str, b: str) -> list[str]:
    """A flow's switches: its leaf, or its leaf, a spine and the other's leaf (spine2 from
    h3, spine1 from every other host)."""
    leaf = {h: f"leaf{(int(h[1:]) - 1) // 4 + 1}" for h in (a, b)}
    spine = "spine2" if a == "h3" else "spine1"
    return [leaf[a]] if leaf[a] == leaf[b] else [leaf[a], spine, leaf[b]]


def flow(a: str, b: str, nbytes: int, i: int, proto: str = "udp") -> dict[str, Any]:
    """A flow entry as the switches counted it, with the labels the lab puts on it."""
    path = route(a, b)
    return {"id": f"q{i}", "kind": "allreduce", "rank": i, "epoch": 0, "cc": "none",
            "src": a, "dst": b, "src_ip": f"10.0.0.{a[1:]}", "dst_ip": f"10.0.0.{b[1:]}",
            "proto": proto, "sport": 49152 + i,
            "dport": ROCE_UDP_PORT if proto == "udp" else 29500,
            "path": path, "hop_bytes": dict.fromkeys(path, nbytes), "bytes": nbytes,
            "interface": "fabric"}


def pfc_counters(scale: float = 1.0) -> dict[str, Any]:
    """pfcd's JSON: the root sent PAUSE and was never paused; every other port was paused
    (``scale`` x its seconds) and sent PAUSE on to its feeders."""
    def port(dev: str, tx: int, rx: int, ns: int) -> dict[str, Any]:
        return {"dev": dev, "priorities": {"3": {"pause_frames_tx": tx, "pause_frames_rx": rx,
                                                 "paused_ns": ns}}}
    return {"ports": [port(ROOT, 400, 0, 0),
                      *(port(d, 100, 200, round(s * scale * S)) for d, s in PAUSED_S.items())]}


def phase(*, pfc: dict[str, Any] | None, exposed: float = 0.7, ideal: float = 0.3,
          ring: list[str] = RING, proto: str = "udp",
          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metrics, details) of an 8 s phase with a 1 s step: the last rank's all-reduce
    ``exposed`` of it against an ``ideal``, the ring's flows and the incast's."""
    flows = [flow(a, b, 4 * MB, i, proto)
             for i, (a, b) in enumerate(zip(ring, ring[1:] + ring[:1], strict=True))]
    flows += [flow(a, b, 12 * MB, 10 + i) for i, (a, b) in enumerate(INCAST)]
    links = [{"node": "leaf2", "peer": "spine1", "util_mean": 0.6, "drops": 0,
              "bw_mbps": 50.0, "tx_bytes": 30 * MB},
             {"node": "spine1", "peer": "leaf1", "util_mean": 0.6, "drops": 0,
              "bw_mbps": 50.0, "tx_bytes": 30 * MB},
             {"node": "leaf1", "peer": "h1", "util_mean": 0.95, "drops": 0,
              "bw_mbps": 25.0, "tx_bytes": 24 * MB}]
    ranks = [{"rank": i, "steps": [{"compute_s": 0.3, "warmup": False}] * 5, "loader": {}}
             for i in range(len(ring))]
    metrics = {"gpu_wait": {"critical_share": {"data_wait": 0.0, "compute": 1.0 - exposed,
                                               "exposed_comm": exposed, "barrier": 0.0},
                            "compute_lag_share": 0.0, "queue_empty_steps": 0,
                            "rank_steps": 20},
               "step_mean_s": 1.0, "ideal_comm_s": ideal, "bottleneck_bps": 25e6,
               "drops": 0, "retransmits": 0}
    details = {"duration_s": 8.0, "links": links, "flows": flows,
               "gpu_wait": {"ranks": ranks}, "scheduler": scheduler_map(ring, [], []),
               "pfc": pfc, "pfc_feeders": FEEDERS if pfc else {}}
    return metrics, details


def diagnosed(metrics: dict[str, Any], details: dict[str, Any]) -> dict[str, Any]:
    return gpuwait.diagnose_phase(metrics, details, TOPO)


def test_pauses_under_a_root_the_ring_never_crosses_are_named_with_their_evidence() -> None:
    d = diagnosed(*phase(pfc=pfc_counters()))
    assert d["named"] == ["pause"]
    pause = next(c for c in d["causes"] if c["cause"] == "pause")
    assert pause["share_of_step"] == pytest.approx(0.4)       # the whole excess: 0.7 - 0.3
    assert pause["fix"] == gpuwait.FIXES["pause"]
    # The ring's flows: h2->h3 (h2's NIC), h3->h6 (h3's NIC, leaf1-eth6 via spine2),
    # h6->h7 (h6's NIC), h7->h2 (h7's NIC, leaf2's uplink to spine1, spine1 to leaf1).
    assert d["pauses"]["roots"] == [ROOT]
    assert d["pauses"]["crossed_root"] is False
    assert d["pauses"]["job_paused_ports"] == {
        "h2-eth0": 1.2, "h3-eth0": 1.1, "h6-eth0": 1.5, "h7-eth0": 1.6, "leaf2-eth5": 2.4,
        "spine1-eth1": 3.0}
    assert d["pauses"]["hops"] == {"h2-eth0": 1, "h3-eth0": 1, "spine1-eth1": 1,
                                   "leaf2-eth5": 2, "h6-eth0": 3, "h7-eth0": 3}
    assert d["pauses"]["held_share"] == pytest.approx(3.0 / 8.0)
    text = pause["evidence"]
    assert f"pauses started at {ROOT}" in text
    assert "spine1-eth1 3.00 s (hop 1)" in text and "leaf2-eth5 2.40 s (hop 2)" in text
    assert f"none of the job's flows crosses {ROOT}: head-of-line blocking" in text
    # ports off the ring's paths, paused as long, are not its evidence
    assert "spine2-eth1" not in text and "h5-eth0" not in text
    lines = gpuwait.render({"p": d})
    assert any(ln.startswith("  pause: 40% of the step") and ROOT in ln for ln in lines)
    assert f"    fix: {gpuwait.FIXES['pause']}" in lines


def test_a_ring_that_crosses_the_root_is_told_apart_from_head_of_line_blocking() -> None:
    """h1 in the ring: its flow into h1 leaves through the root, among the incast."""
    d = diagnosed(*phase(pfc=pfc_counters(), ring=["h1", "h3", "h6", "h7"]))
    assert d["named"] == ["pause"]
    assert d["pauses"]["crossed_root"] is True
    text = next(c for c in d["causes"] if c["cause"] == "pause")["evidence"]
    assert f"the job's flows cross {ROOT}" in text and "head-of-line" not in text


def test_without_pfc_the_same_excess_is_the_networks_as_before() -> None:
    d = diagnosed(*phase(pfc=None))
    assert d["named"] == ["network"]
    assert "pauses" not in d and "pause" not in {c["cause"] for c in d["causes"]}


def test_a_tcp_ring_is_not_held_by_the_lossless_prioritys_pauses() -> None:
    """The same pauses, the ring on TCP (the lossy class): PFC held none of its packets."""
    d = diagnosed(*phase(pfc=pfc_counters(), proto="tcp"))
    assert d["named"] == ["network"]
    assert "pauses" not in d


@pytest.mark.parametrize("held, cause", [(gpuwait.PAUSE_MIN_HELD - 0.005, "network"),
                                         (gpuwait.PAUSE_MIN_HELD + 0.005, "pause")])
def test_the_excess_is_the_pauses_from_how_long_they_held_the_rings_paths(
        held: float, cause: str) -> None:
    """The ring's longest-paused port (spine1-eth1, 3.0 s) scaled to ``held`` of the 8 s
    phase: just under the line the excess stays the network's, just over it the pauses'."""
    d = diagnosed(*phase(pfc=pfc_counters(held * 8.0 / 3.0)))
    assert d["pauses"]["held_share"] == pytest.approx(held, abs=1e-4)
    assert d["named"] == [cause]


def test_the_stripped_result_gives_the_same_causes() -> None:
    """Phases renamed, flows' labels (their ids too) and the phases' settings gone: the
    same causes, pause where PFC held the ring."""
    result = {"schema": 1, "kind": "collective", "topology": TOPO, "metrics": {"phases": {}},
              "phase_details": {}}
    for name, pfc in (("incast-pfc", pfc_counters()), ("incast-lossy", None),
                      ("quiet", pfc_counters(0.01))):
        m, d = phase(pfc=pfc)
        result["metrics"]["phases"][name] = {**m, "cc": "none", "placement": "spread"}
        result["phase_details"][name] = d
    s = gpuwait.stripped(result)
    assert all("id" not in f or f["id"].startswith("f") for d in
               s["result"]["phase_details"].values() for f in d["flows"])
    full, blind = gpuwait.diagnose(result), gpuwait.diagnose(s["result"])
    named = {n: blind[s["alias"][n]]["named"] for n in full}
    assert named == {n: d["named"] for n, d in full.items()}
    assert named == {"incast-pfc": ["pause"], "incast-lossy": ["network"],
                     "quiet": ["network"]}
    assert blind[s["alias"]["incast-pfc"]]["pauses"] == full["incast-pfc"]["pauses"]
