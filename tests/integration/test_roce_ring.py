"""``roce_ring`` (``lab/agents/roce``): ring All-Reduce ranks over the RoCEv2 transport, on
real packets.

Rig: four rank namespaces h0..h3 around one switch namespace S (``nsrig.NsRig``, subnet
10.81), each rank's default route through S. Each of S's ports towards a rank is shaped
exactly like a lab switch port (htb + bfifo at 50 Mbit/s, with the lab's wire size table,
so its byte counter counts what the program calls wire bytes). Rank r writes to rank r+1,
so S's port towards h(r+1) carries exactly rank r's hop of the ring (and the ACKs rank r+2
sends back to r+1's QP): one hop per port, no two hops sharing one. The tests check that
every rank completes every step, that a step's All-Reduce takes the ring's ideal time at
the port's rate, that each hop's port carried the ring's share of the bytes, that tshark
reads the packets as InfiniBand, and that a rank without peers fails, or stops on SIGTERM,
as the README says. Run with ``pytest -s`` to see the numbers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from controllers import cbuild
from lab.agents import roce
from lab.net.links import tc_commands
from lab.net.wire import Qdisc, count_wire_bytes
from tests.integration.nsrig import NsRig
from tests.integration.test_roce_transport import pcap_ip_packets, tshark_fields
from tests.unit.test_roce_wire import icrc_by_zlib

WORLD = 4
RATE_MBIT = 50
QUEUE_BYTES = 150_000
SIZE = 262_144
STEPS, WARMUP = 8, 1
COMPUTE_S = 0.05
MTU = 1024
CHUNK = SIZE // WORLD
SUBSTEPS = 2 * (WORLD - 1)
SPORT_BASE = 50_000
#: A data packet on the wire: IPv4 20, UDP 8, BTH 12, payload, ICRC 4, and the Ethernet
#: header, FCS, preamble and gap (38) the port's size table adds; a chunk's First packet
#: carries the RETH's 16 bytes more.
FULL_WIRE = 20 + 8 + 12 + MTU + 4 + 38
CHUNK_WIRE = CHUNK // MTU * FULL_WIRE + 16
#: An ACK (BTH + AETH) and a start barrier's token (a 4-byte WRITE Only: BTH + RETH) on
#: the wire; a rank sends N-1 tokens, the first one (the hello) maybe more than once.
ACK_WIRE = 20 + 8 + 12 + 4 + 4 + 38
TOKEN_BYTES = 4
TOKEN_WIRE = 20 + 8 + 12 + 16 + TOKEN_BYTES + 4 + 38
TOKENS = WORLD - 1
#: The payload rate of a 50 Mbit/s port: the payload share of a full packet's wire bytes.
PAYLOAD_BPS = RATE_MBIT * 1e6 / 8 * MTU / FULL_WIRE
#: A step's All-Reduce at that rate if the hops never waited: each rank sends (and
#: receives) 2(N-1)/N of the buffer, every hop at once.
IDEAL_COMM_S = SUBSTEPS * CHUNK / PAYLOAD_BPS
#: Extra bytes a port may carry besides the ring's: S's ARP.
TC_SLACK_BYTES = 1_000

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root: network namespaces, tc")


def hosts() -> list[str]:
    return [f"h{i}" for i in range(WORLD)]


@dataclass(kw_only=True)
class RingRig(NsRig):
    """Ranks h0..h(N-1) on a star around S; S's port towards each rank is lab-shaped."""

    links: list[tuple[str, str]] = field(default_factory=lambda: [(h, "s") for h in hosts()])
    routes: list[tuple[str, str, str]] = field(default_factory=list)
    family: str = "rring"
    subnet: str = "10.81"
    program: Path = Path()

    def __post_init__(self) -> None:
        self.routes = [(h, "default", self.addr("s", h)) for h in hosts()]

    def ip(self, rank: int) -> str:
        return self.addr(f"h{rank % WORLD}", "s")

    def port(self, rank: int) -> str:
        """S's device towards rank ``rank``."""
        return self.dev("s", f"h{rank % WORLD}")

    def start(self) -> None:
        super().start()
        for r in range(WORLD):
            for cmd in tc_commands(self.port(r), RATE_MBIT, QUEUE_BYTES):
                self.ns("s", *cmd.split())
        count_wire_bytes(self.sleepers["s"], [Qdisc(self.port(r)) for r in range(WORLD)])
        for r in range(WORLD):       # ARP settled: h(r) and S know each other
            self.ns(f"h{r}", "ping", "-c", "1", "-W", "2", self.ip(r + 1))

    def port_bytes(self) -> list[int]:
        """Wire bytes each port towards rank r has sent, r = 0..N-1."""
        return [next(q for q in self.tc_json("s", self.port(r), "qdisc") if q.get("root"))
                ["bytes"] for r in range(WORLD)]

    def rank_argv(self, rank: int, out: Path, *extra: str) -> list[str]:
        return [str(self.program), "--rank", str(rank), "--world", str(WORLD),
                "--next", self.ip(rank + 1), "--prev", self.ip(rank - 1),
                "--bind", self.ip(rank), "--src-port", str(SPORT_BASE + rank),
                "--rate-mbps", str(RATE_MBIT), "--mtu", str(MTU), "--out", str(out), *extra]

    def start_rank(self, rank: int, out: Path, *extra: str) -> subprocess.Popen:
        return self.spawn(f"h{rank}", *self.rank_argv(rank, out, *extra),
                          stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """roce_ring built as the lab builds it (``lab.agents.roce.ROCE_RING``)."""
    return cbuild.build("roce_ring", roce.ROCE_RING,
                        build_dir=tmp_path_factory.mktemp("roce-ring-build"))


@pytest.fixture(scope="module")
def rig(program: Path) -> Iterator[RingRig]:
    r = RingRig(program=program)
    try:
        r.start()
        yield r
    finally:
        r.close()


@pytest.fixture(scope="module")
def ring_run(rig: RingRig, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """All four ranks, STEPS steps of SIZE bytes; the port counters around the run and a
    capture of the first packets on S's port towards h1 (rank 0's hop)."""
    tmp = tmp_path_factory.mktemp("ring")
    pcap = tmp / "hop0.pcap"
    before = rig.port_bytes()
    cap = rig.capture("s", rig.port(1), pcap, "-Q", "out", "-c", "200", "udp port 4791")
    t0 = time.monotonic()
    try:
        procs = [rig.start_rank(r, tmp / f"rank{r}.json", "--size", str(SIZE), "--steps",
                                str(STEPS), "--warmup", str(WARMUP), "--compute-s",
                                str(COMPUTE_S), "--connect-timeout-s", "10",
                                "--io-timeout-s", "10")
                 for r in range(WORLD)]
        for p in procs:
            p.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        rig.stop(cap)
    after = rig.port_bytes()
    errs = [p.stderr.read() if p.stderr else "" for p in procs]
    for r, p in enumerate(procs):
        assert (tmp / f"rank{r}.json").is_file(), f"rank {r} (exit {p.returncode}): {errs[r]}"
    ranks = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD)]
    print(f"\n(1) ring of {WORLD}, {STEPS} steps of {SIZE} B in {took:.2f} s, ideal comm "
          f"{IDEAL_COMM_S * 1e3:.1f} ms")
    for r, j in enumerate(ranks):
        comm = [round(s["comm_s"] * 1e3, 1) for s in j["steps"]]
        wall = j["connections"][0]["t_close"] - j["connections"][0]["t_open"]
        print(f"    rank {r}: comm_s (ms) {comm}; retrans {[s['retrans'] for s in j['steps']]}"
              f"; ready after {j['t_ready'] - j['connections'][0]['t_open']:.3f} s; cpu "
              f"{j['cpu_s']:.3f} s over {wall:.2f} s = {100 * j['cpu_s'] / wall:.1f} % of a core")
    return {"ranks": ranks, "codes": [p.returncode for p in procs], "errs": errs,
            "port": [a - b for a, b in zip(after, before, strict=True)], "pcap": pcap}


def test_every_rank_completes_every_step(ring_run: dict) -> None:
    """Exit 0, no error, STEPS steps each; every chunk sent was acknowledged and every chunk
    of the previous rank arrived (its barrier tokens too), each byte once; a step ends with
    its All-Reduce (no separate barrier). A step may resend a few packets: with the 4 ms
    timer, a next rank this busy machine did not run for 4 ms draws a spurious timeout (at
    most a chunk's packets go again; the duplicates are dropped and re-ACKed)."""
    for r, j in enumerate(ring_run["ranks"]):
        assert ring_run["codes"][r] == 0 and j["error"] is None, (r, ring_run["errs"][r])
        assert (j["mode"], j["transport"], j["rank"], j["world"]) == ("ring", "roce", r, WORLD)
        assert j["t_ready"] is not None and len(j["steps"]) == STEPS
        assert [s["warmup"] for s in j["steps"]] == [True] * WARMUP + [False] * (STEPS - WARMUP)
        for s in j["steps"]:
            assert s["t_start"] <= s["t_compute_end"] <= s["t_comm_start"] < s["t_comm_end"]
            assert s["t_end"] == s["t_comm_end"] and s["barrier_s"] == 0
            assert s["compute_s"] >= COMPUTE_S and s["retrans"] <= CHUNK // MTU
        assert j["steps"][0]["t_start"] == j["t_ready"]
        req, resp = j["qp"]["requester"], j["qp"]["responder"]
        assert req["messages_completed"] == req["messages_posted"] == STEPS * SUBSTEPS
        assert req["payload_bytes_sent"] >= STEPS * SUBSTEPS * CHUNK + TOKENS * TOKEN_BYTES
        assert resp["messages_received"] == STEPS * SUBSTEPS + TOKENS
        assert resp["payload_bytes_received"] == STEPS * SUBSTEPS * CHUNK + TOKENS * TOKEN_BYTES
        assert resp["peer_qpn"] == ring_run["ranks"][r - 1]["qp"]["requester"]["qpn"]
        conn = j["connections"][0]
        assert (conn["sport"], conn["dport"]) == (SPORT_BASE + r, 4791)


def test_one_ring_paces_every_rank(ring_run: dict) -> None:
    """The ranks finish each step's All-Reduce together: a rank's last sub-step waits for
    chunks that passed through every other rank, so no rank runs a sub-step ahead."""
    ranks = ring_run["ranks"]
    for step in range(STEPS):
        ends = [j["steps"][step]["t_comm_end"] for j in ranks]
        assert max(ends) - min(ends) < 0.5 * IDEAL_COMM_S / SUBSTEPS, (step, ends)


def test_comm_time_is_the_rings_ideal(ring_run: dict) -> None:
    """After the warmup each step's comm_s is within 40 % of 2(N-1)/N x SIZE at the port's
    payload rate. Why so generous: each of the 2(N-1) sub-steps waits for the previous
    rank's whole chunk, so every wake-up late on this shared 2-core machine (N ranks and
    S's forwarding on it) and every pacer burst that htb holds back adds to the step; the
    wire itself cannot be beaten (the floor is 0.95: htb's bucket lets a little through
    early)."""
    for r, j in enumerate(ring_run["ranks"]):
        for s in j["steps"][WARMUP:]:
            assert 0.95 * IDEAL_COMM_S <= s["comm_s"] <= 1.4 * IDEAL_COMM_S, (r, s)


def test_each_hop_carries_the_rings_share(ring_run: dict) -> None:
    """S's port towards rank r+1 carries rank r's chunks (2(N-1)/N x SIZE per step) and
    barrier tokens, and the ACKs rank r+2 sends r+1: exactly what the QPs counted, and
    within 1 % of the formula."""
    ranks = ring_run["ranks"]
    for r, j in enumerate(ranks):
        port = ring_run["port"][(r + 1) % WORLD]
        answers = ranks[(r + 2) % WORLD]["qp"]["responder"]
        counted = j["qp"]["requester"]["wire_bytes_sent"] + ACK_WIRE * (
            answers["acks_sent"] + answers["naks_sent"])
        assert 0 <= port - counted <= TC_SLACK_BYTES, (r, port, counted)
        formula = STEPS * SUBSTEPS * CHUNK_WIRE + TOKENS * TOKEN_WIRE
        assert formula <= port <= 1.01 * formula, (r, port, formula)


def test_tshark_decodes_the_ring_as_infiniband(ring_run: dict) -> None:
    """Rank 0's hop: the barrier's tokens (4-byte WRITE Only), then WRITE First/Middle/Last
    from UDP source port SPORT_BASE to 4791, DSCP 26 ECT(0), to the QP rank 1 answers for;
    the ACKs of rank 1's own QP; each ICRC as zlib computes it."""
    rows = tshark_fields(ring_run["pcap"], "frame.protocols", "udp.srcport", "udp.dstport",
                         "ip.dsfield.dscp", "ip.dsfield.ecn", "infiniband.bth.opcode",
                         "infiniband.bth.destqp", "infiniband.reth.dmalen")
    req = ring_run["ranks"][0]["qp"]["requester"]
    data = [r for r in rows if r[5] in ("6", "7", "8", "10")]
    assert len(rows) == 200 and all("infiniband" in r[0] for r in rows), rows[:3]
    assert all(r[2] == "4791" for r in rows)
    # the tokens (the hello again every 50 ms while rank 1 was not up yet), then chunks
    tokens = len([r for r in data if r[5] == "10"])
    assert tokens >= TOKENS and all(r[5] == "10" and r[7] == "4" for r in data[:tokens])
    assert {r[5] for r in data[tokens:]} == {"6", "7", "8"}
    assert all((r[1], r[3], r[4]) == (str(SPORT_BASE), "26", "2") for r in data), [
        r for r in data if (r[1], r[3], r[4]) != (str(SPORT_BASE), "26", "2")][:5]
    assert all(int(r[6], 16) == req["dqpn"] for r in data)
    assert all(r[7] == str(CHUNK) for r in data[1:] if r[5] == "6")
    packets = [p for p in pcap_ip_packets(ring_run["pcap"]) if p[9] == 17]
    assert packets and all(p[-4:] == icrc_by_zlib(p) for p in packets)


def test_a_rank_without_its_next_fails_within_the_connect_timeout(rig: RingRig,
                                                                  tmp_path: Path) -> None:
    """Ranks 0 and 3 only: rank 0's next (1) never answers the hello, rank 3's previous (2)
    never says hello. Each exits 1 once the connect timeout has passed, saying which peer
    on one line and in its JSON."""
    outs = [tmp_path / "rank0.json", tmp_path / "rank3.json"]
    t0 = time.monotonic()
    procs = [rig.start_rank(r, out, "--size", str(SIZE), "--steps", "2",
                            "--connect-timeout-s", "1.5") for r, out in zip((0, 3), outs,
                                                                             strict=True)]
    for p in procs:
        p.wait(timeout=10)
    took = time.monotonic() - t0
    errs = [p.stderr.read() if p.stderr else "" for p in procs]
    print(f"\n(2) without peers, after {took:.2f} s: {errs}")
    assert [p.returncode for p in procs] == [1, 1] and took < 4
    assert all(e.count("\n") == 1 for e in errs)
    j0, j3 = (json.loads(o.read_text()) for o in outs)
    assert f"the next rank ({rig.ip(1)}) did not answer the hello within 1.5 s" in errs[0]
    assert f"no hello from the previous rank ({rig.ip(2)}) within 1.5 s" in errs[1]
    for j, err in ((j0, errs[0]), (j3, errs[1])):
        assert j["error"] in err and j["t_ready"] is None and j["steps"] == []
    assert j0["qp"]["requester"]["rto_events"] >= 20        # the hello, every 50 ms
    assert j3["qp"]["requester"]["acks_received"] == 1      # rank 0 answered rank 3


def test_sigterm_writes_what_was_done_and_exits_0(rig: RingRig, tmp_path: Path) -> None:
    """A rank waiting for its peers, stopped by SIGTERM: exit 0, its JSON says so."""
    out = tmp_path / "rank0.json"
    p = rig.start_rank(0, out, "--size", str(SIZE), "--steps", "2")
    time.sleep(0.5)
    os.kill(p.pid, signal.SIGTERM)
    p.wait(timeout=10)
    j = json.loads(out.read_text())
    assert p.returncode == 0 and j["stopped_by_signal"] and j["error"] is None
    assert j["steps"] == [] and j["t_ready"] is None


def test_a_bad_option_is_one_line_and_exit_2(program: Path) -> None:
    for argv, name in ((["--rank", "0", "--world", "3", "--next", "10.0.0.1", "--prev",
                         "10.0.0.1", "--bind", "10.0.0.1", "--size", "1000", "--steps", "1",
                         "--out", "x.json"], "--size"),
                       (["--rank", "0", "--world", "3", "--cc", "cubic"], "--cc"),
                       (["--rank", "0", "--world", "3", "--placement", "late"], "--placement"),
                       (["--rank", "0", "--world", "3", "--next", "10.0.0.1", "--prev",
                         "10.0.0.1", "--bind", "10.0.0.1", "--size", "999", "--steps", "1",
                         "--out", "x.json", "--spray", "4"], "--spray"),     # no --src-port
                       (["--world", "3"], "--rank")):
        r = subprocess.run([str(program), *argv], capture_output=True, text=True, timeout=10)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(f"roce_ring: {name}:"), r.stderr
