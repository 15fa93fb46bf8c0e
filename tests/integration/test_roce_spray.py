"""Packet spraying on real packets: one RoCE QP over two equal-cost paths, and what the
reordering it makes costs each receiver (``roce_bw --spray``, ``--placement``).

Rig: A - S, then two paths S - P - T and S - Q - T, then T - B. S routes towards B by the
kernel's ECMP with the L4 hash (``fib_multipath_hash_policy=1``: the UDP source port is in
it), so one QP keeps one path and a sprayed QP's entropy values spread over both. S's port
towards P runs at 100 Mbit/s, towards Q at 10: a sprayed QP's packets through Q queue
while those through P pass, so they arrive out of order, without loss. Per
run the two ports' byte counters say where the QP went.

- Not sprayed: one path carries the QP.
- Sprayed over 64 values, out-of-order placement: both paths carry a share, packets are
  placed ahead of gaps, and nothing is sent twice.
- Sprayed, RC's go-back-N receiver: every reordering is a gap to it, so it NAKs and the
  sender goes back; it delivers less than out-of-order placement.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from controllers import cbuild
from lab.agents import roce
from lab.net.links import tc_commands
from tests.integration.test_roce_transport import MTU, SIZE, Rig

#: The two paths' rates and the client's pace (Mbit/s): one QP on one path at 9 (either
#: path carries it alone); sprayed at 24, more than Q's half can carry, so Q's queue
#: holds the QP's packets there (tens of ms) while P's pass at once: reordering (there is
#: no netem here: a queue is the only delay). The QP has at most 2 messages of 64 packets
#: out, fewer than Q's queue holds: it waits, and nothing is dropped.
FAST_MBIT, SLOW_MBIT, ONE_PATH_MBIT, SPRAYED_MBIT = 100, 10, 9, 24
#: Above Q's queueing delay, for both receivers alike: spurious timeouts are not the point.
RTO_MS = 200
#: Out-of-order placement's NAK threshold: more than the QP has outstanding, so only a
#: loss makes a NAK (a reordering never reaches it).
REORDER_PKTS = 256
#: Entropy values per packet: 64 hashed onto 2 paths leave fewer than a quarter on one
#: with a chance of about 1e-5.
SPRAY = 64
#: Each path's least share of a sprayed QP's bytes.
LEAST_SHARE = 0.25
QUEUE_BYTES = 150_000
ARGS = ("--qps", "1", "--size", str(SIZE), "--tx-depth", "2", "--mtu", str(MTU),
        "--duration", "2", "--cc", "none")


@dataclass(kw_only=True)
class Diamond(Rig):
    """A - S - {P, Q} - T - B (``nsrig.NsRig``, subnet 10.79)."""

    family: str = "rsp"
    subnet: str = "10.79"
    links: list[tuple[str, str]] = field(default_factory=lambda: [
        ("a", "s"), ("s", "p"), ("s", "q"), ("p", "t"), ("q", "t"), ("t", "b")])

    def __post_init__(self) -> None:
        a_net, b_net = f"{self.subnet}.1.0/24", f"{self.subnet}.6.0/24"
        self.routes = [("a", "default", self.addr("s", "a")),
                       ("b", "default", self.addr("t", "b")),
                       ("p", a_net, self.addr("s", "p")), ("p", b_net, self.addr("t", "p")),
                       ("q", a_net, self.addr("s", "q")), ("q", b_net, self.addr("t", "q")),
                       ("t", a_net, self.addr("p", "t"))]      # the ACKs: one path

    @property
    def ip_b(self) -> str:
        return self.addr("b", "t")

    def start(self) -> None:
        super(Rig, self).start()             # NsRig's: namespaces, veths, routes
        self.ns("s", "sysctl", "-q", "-w", "net.ipv4.fib_multipath_hash_policy=1")
        self.ns("s", "ip", "route", "add", f"{self.subnet}.6.0/24",
                "nexthop", "via", self.addr("p", "s"), "nexthop", "via", self.addr("q", "s"))
        for peer, rate in (("p", FAST_MBIT), ("q", SLOW_MBIT)):
            for cmd in tc_commands(self.dev("s", peer), rate, QUEUE_BYTES):
                self.ns("s", *cmd.split())
        self.ns("a", "ping", "-c", "1", "-W", "2", self.ip_b)   # ARP settled

    def path_bytes(self) -> dict[str, int]:
        """Bytes S's port towards P and towards Q have sent."""
        out = {}
        for peer in ("p", "q"):
            root = next(q for q in self.tc_json("s", self.dev("s", peer), "qdisc")
                        if q.get("root"))
            out[peer] = root["bytes"]
        return out


@pytest.fixture(scope="module")
def rig() -> Iterator[Diamond]:
    r = Diamond(program=cbuild.build("roce_bw", roce.ROCE_BW))
    try:
        r.start()
        yield r
    finally:
        r.close()


def run(rig: Diamond, tmp: Path, placement: str, spray: int = 1) -> dict:
    """One QP for 2 s: its client's and server's counters, and each path's bytes."""
    tmp.mkdir(parents=True, exist_ok=True)
    before = rig.path_bytes()
    pace = SPRAYED_MBIT if spray > 1 else ONE_PATH_MBIT
    client, server, code = rig.run(tmp, *ARGS, "--spray", str(spray), "--rate-mbps",
                                   str(pace), "--rto-ms", str(RTO_MS),
                                   server_args=("--placement", placement,
                                                "--reorder-pkts", str(REORDER_PKTS)))
    after = rig.path_bytes()
    paths = {k: after[k] - before[k] for k in after}
    print(f"\n{placement} {spray}: goodput {client['goodput_mbps']} Mbit/s, paths {paths}, "
          f"{client['totals']}\n    server {server['totals']}")
    assert code == 0 and client["error"] is None, client["error"]
    return {"client": client, "server": server["totals"], "paths": paths}


def test_one_qp_keeps_one_path(rig: Diamond, tmp_path: Path) -> None:
    r = run(rig, tmp_path, "gbn")
    assert max(r["paths"].values()) > 0.99 * sum(r["paths"].values())
    assert r["client"]["totals"]["retransmitted_packets"] == 0


def test_spraying_with_out_of_order_placement(rig: Diamond, tmp_path: Path) -> None:
    """Both paths carry the QP; the slow path's packets arrive late and are placed ahead of
    the gap; no NAK, nothing sent twice, every byte accepted once."""
    r = run(rig, tmp_path, "ooo", SPRAY)
    total = sum(r["paths"].values())
    assert all(b >= LEAST_SHARE * total for b in r["paths"].values()), r["paths"]
    assert r["server"]["placed_out_of_order"] > 0
    assert r["server"]["naks_sent"] == 0
    assert r["client"]["totals"]["retransmitted_packets"] == 0
    assert r["server"]["payload_bytes_received"] == r["client"]["totals"][
        "messages_completed"] * SIZE


def test_go_back_n_loses_to_out_of_order_placement_under_spraying(rig: Diamond,
                                                                   tmp_path: Path) -> None:
    ooo = run(rig, tmp_path / "ooo", "ooo", SPRAY)
    gbn = run(rig, tmp_path / "gbn", "gbn", SPRAY)
    assert gbn["server"]["out_of_sequence"] > 0 and gbn["server"]["naks_sent"] > 0
    assert gbn["client"]["totals"]["retransmitted_packets"] > 0
    assert gbn["client"]["goodput_mbps"] < ooo["client"]["goodput_mbps"]
