"""The PFC prototype (controllers/pfc/pfcd.c) on real packets, on rigs of our own.

One hop: senders A and C feed switch S, whose port towards B (50 Mbit/s) is the congested
one. Every data port has traffic classes: htb 1: with class 1:1 at the link rate, lossless
1:10 (DSCP 26 and 48, prio 0) and lossy 1:20 (the rest), each half the link with ceil the
link, each with its own bfifo leaf (10:, 20:), and the lab's wire size table. UDP floods at
fixed rates (iperf3) overload S's lossless class; pfcd watches its leaf and pauses A's and
C's lossless classes. Two hops: A-S1-S2-B with the slow port at S2; the pause reaches A
through S1. pfcd is configured and run as the controller runs it (``controllers.pfc``), the
ports shaped as the lab shapes them (``controllers.classes``). Run with ``pytest -s`` to see
the numbers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from controllers import pfc
from controllers.classes import LOSSLESS_CLASS, TrafficClasses
from controllers.marking import WIRE_FRAME_BYTES
from controllers.pfc import Feeder, PfcConfig, Pfcd, WatchedPort
from lab.net.wire import Qdisc, count_wire_bytes
from tests.integration.nsrig import NsRig

LINK_MBIT = 50
#: The lossless class's share of each port (rate = weight x link, ceil = link).
LOSSLESS_WEIGHT = 0.5
TOS_LOSSLESS = 0x68          # DSCP 26, RoCEv2 data
TOS_CNP = 0xC0               # DSCP 48, CNPs travel lossless too
XOFF, XON = 20_000, 10_000
#: The rule (controllers/pfc/README.md) for each feeder: rate x (2 x delay + reaction) +
#: 2 MTU, with no link delay (veth) and a reaction budget of 1.5 ms (one 1 ms poll, the
#: dump and the change); S has two feeders at 50 Mbit/s.
REACTION_BUDGET_S = 1.5e-3
HEADROOM = 2 * pfc.headroom_bytes(LINK_MBIT * 1e6, 0, REACTION_BUDGET_S)
LOSSLESS_LIMIT = XOFF + HEADROOM + 15_000
#: Host NICs and lossy classes: deep enough never to be the question here.
DEEP_LIMIT = 300_000
#: What a paused class is held at. htb charges the frame a paused class still sends at this
#: rate, and the class owes that frame's time after the resume: 2.5 Mbit/s (5 % of the
#: link) leaks at most one 1538-byte frame per 4.9 ms and delays a resume by at most that.
PAUSE_BPS = 2_500_000
RUN_S = 3
LOSSY_MBIT = 5


@dataclass
class Port:
    """A shaped egress port: its namespace, device and rate."""

    ns: str
    dev: str
    mbit: float = LINK_MBIT
    lossless_limit: int = LOSSLESS_LIMIT


@dataclass(kw_only=True)
class Rig(NsRig):
    """A rig of this test's (``nsrig.NsRig``, subnet 10.79) with the lab's traffic classes
    on its data ports, and what the tests read of them."""

    family: str = "pfct"
    subnet: str = "10.79"

    def shape(self, port: Port) -> None:
        """Traffic classes on an egress port, as the module doc says, counted in wire
        bytes like every lab port: the lab's own commands (``TrafficClasses``)."""
        classes = TrafficClasses(weight=LOSSLESS_WEIGHT, lossless_limit_bytes=port.lossless_limit,
                                 lossy_limit_bytes=DEEP_LIMIT)
        assert set(classes.dscps) == {TOS_LOSSLESS >> 2, TOS_CNP >> 2}
        for cmd in classes.tc_commands(port.dev, port.mbit):
            self.ns(port.ns, *cmd.split())
        count_wire_bytes(self.sleepers[port.ns], [Qdisc(port.dev)])

    def port_json(self, port: Port, what: str) -> list[dict]:
        return self.tc_json(port.ns, port.dev, what)

    def queue_drops(self, port: Port, handle: str = "10:") -> int:
        """Packets the port's leaf ``handle`` dropped, as ``tc -s qdisc`` counts them."""
        return next(q["drops"] for q in self.port_json(port, "qdisc") if q["handle"] == handle)

    def drain(self, ports: list[Port], timeout: float = 10) -> None:
        """Wait until every port's queues are empty. When the senders stop, the hosts'
        paused lossless queues still hold what PFC held back; stopping the engine before
        they are sent would let them flood the switch unpaused."""
        deadline = time.monotonic() + timeout
        while any(q["backlog"] for p in ports for q in self.port_json(p, "qdisc")):
            assert time.monotonic() < deadline, "queues did not drain"
            time.sleep(0.02)

    def class_stats(self, port: Port, classid: str) -> dict:
        """An htb class as ``tc -s class show`` prints it (this iproute2 has no JSON for
        htb classes): rate (bit/s), bytes, packets, tokens and ctokens (64 ns ticks)."""
        out = self.ns(port.ns, "tc", "-s", "class", "show", "dev", port.dev).stdout
        for block in ("\n" + out).split("\nclass ")[1:]:
            words = block.split()     # htb 1:10 parent 1:1 ... Sent B bytes P pkt ... tokens: T
            if words[1] != classid:
                continue
            after = {w.rstrip(":"): words[i + 1] for i, w in enumerate(words[:-1])}
            return {"rate": _tc_rate(after["rate"]), "bytes": int(after["Sent"]),
                    "packets": int(after["bytes"]), "tokens": int(after["tokens"]),
                    "ctokens": int(after["ctokens"])}
        raise KeyError(f"{port.dev}: no class {classid}")


def _tc_rate(text: str) -> float:
    """tc's printed rate ("25Mbit", "8bit") in bit/s."""
    for unit, scale in (("Gbit", 1e9), ("Mbit", 1e6), ("Kbit", 1e3), ("bit", 1.0)):
        if text.endswith(unit):
            return float(text.removesuffix(unit)) * scale
    raise ValueError(f"not a tc rate: {text!r}")


@dataclass
class Flow:
    """A fixed-rate UDP flood (iperf3 -u) from ``src`` to B's server on ``port``."""

    src: str
    port: int
    mbit: float
    tos: int


def start_servers(rig: Rig, dst: str, ip: str, ports: list[int]) -> None:
    for p in ports:
        rig.spawn(dst, "iperf3", "-s", "-B", ip, "-p", str(p), stdout=subprocess.DEVNULL,
                  stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not all(f":{p} " in rig.ns(dst, "ss", "-Hltn").stdout for p in ports):
        assert time.monotonic() < deadline, "iperf3 servers did not start"
        time.sleep(0.05)


def run_flows(rig: Rig, dst_ip: str, flows: list[Flow], seconds: int) -> list[dict]:
    """All flows at once; each one's iperf3 result (``end.sum``: what B received)."""
    procs = [rig.spawn(f.src, "iperf3", "-c", dst_ip, "-p", str(f.port), "-u", "-b",
                       f"{f.mbit}M", "-l", "1472", "--tos", str(f.tos), "-t", str(seconds),
                       "-J", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for f in flows]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=seconds + 30)
        assert p.returncode == 0, err or out[-500:]
        results.append(json.loads(out)["end"]["sum"])
    return results


class Engine:
    """pfcd as the controller runs it (``controllers.pfc.Pfcd``): started on a config,
    stopped by SIGTERM (by PID); its counters and the CPU it used, read from /proc over the
    run. The rig kills it by PID if a test fails before it is stopped."""

    def __init__(self, rig: Rig, binary: Path, config: PfcConfig, workdir: Path) -> None:
        self.pfcd = Pfcd(config, binary, workdir / "pfcd.json", workdir / "pfcd.log")
        self.pfcd.start()
        assert self.pfcd.proc is not None
        rig.procs.append(self.pfcd.proc)
        self.t0, self.ticks0 = time.monotonic(), self._ticks()

    def _ticks(self) -> int:
        fields = Path(f"/proc/{self.pfcd.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])      # utime + stime

    def stop(self) -> dict:
        ticks, wall = self._ticks() - self.ticks0, time.monotonic() - self.t0
        report = self.pfcd.stop()
        report["cpu_per_s_proc"] = ticks / os.sysconf("SC_CLK_TCK") / wall
        report["stderr"] = self.pfcd.stderr_tail()
        return report


def pfcd_config(rig: Rig, watched: list[tuple[Port, list[Port]]],
                pause_bps: int) -> PfcConfig:
    """pfcd's config: each watched port's lossless leaf and the feeders it pauses, each
    port checked against its leaf's size as the lab checks a scenario's."""
    def ns(port: Port) -> str:
        return f"/run/netns/{rig.name(port.ns)}"
    ports = tuple(WatchedPort(ns(port), port.dev, XOFF, XON, tuple(
        Feeder(ns(f), f.dev, rate_bps=int(LOSSLESS_WEIGHT * f.mbit * 1e6),
               ceil_bps=int(f.mbit * 1e6)) for f in feeders)) for port, feeders in watched)
    for port, (shaped, _) in zip(ports, watched, strict=True):
        pfc.check_port(port, shaped.lossless_limit, REACTION_BUDGET_S)
    return PfcConfig(ports, pause_bps)


def counters(rig: Rig, report: dict, port: Port) -> dict:
    """pfcd's counters for a port at priority 3."""
    return next(p["priorities"]["3"] for p in report["ports"]
                if p["dev"] == port.dev and p["ns"] == f"/run/netns/{rig.name(port.ns)}")


def snapshot(rig: Rig, port: Port) -> dict[str, int]:
    """The kernel's counters of a port's classes: lossless leaf drops, bytes per class."""
    return {"drops": rig.queue_drops(port),
            "lossless_bytes": rig.class_stats(port, "1:10")["bytes"],
            "lossy_bytes": rig.class_stats(port, "1:20")["bytes"]}


def run_phase(rig: Rig, ports: list[Port], dst_ip: str, flows: list[Flow],
              engine: Engine | None, drain: bool = True) -> dict:
    """One load run: counter deltas per port, iperf3's results, pfcd's report if any.
    With ``drain``, the engine runs until the queues are empty."""
    before = {p.dev: snapshot(rig, p) for p in ports}
    try:
        results = run_flows(rig, dst_ip, flows, RUN_S)
        if drain:
            rig.drain(ports)
    finally:
        report = engine.stop() if engine else None
    after = {p.dev: snapshot(rig, p) for p in ports}
    delta = {dev: {k: after[dev][k] - before[dev][k] for k in after[dev]} for dev in after}
    return {"delta": delta, "iperf": results, "pfcd": report}


@pytest.fixture(scope="module")
def pfcd_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Pfcd.build(tmp_path_factory.mktemp("pfcd-build"))


@dataclass
class OneHop:
    """A and C feed S; S's port towards B is the congested one."""

    rig: Rig
    a: Port
    c: Port
    s: Port
    ip_b: str
    flows: list[Flow]

    @property
    def ports(self) -> list[Port]:
        return [self.a, self.c, self.s]

    def config(self, pause_bps: int = PAUSE_BPS) -> PfcConfig:
        return pfcd_config(self.rig, [(self.s, [self.a, self.c])], pause_bps)


def one_hop(prefix: str, s_mbit: float, flows: list[Flow]) -> OneHop:
    rig = Rig(links=[("a", "s"), ("c", "s"), ("s", "b")], prefix=prefix,
              routes=[("a", "default", "10.79.1.2"), ("c", "default", "10.79.2.2"),
                      ("b", "default", "10.79.3.1")])
    hop = OneHop(rig, Port("a", rig.dev("a", "s"), lossless_limit=DEEP_LIMIT),
                 Port("c", rig.dev("c", "s"), lossless_limit=DEEP_LIMIT),
                 Port("s", rig.dev("s", "b"), mbit=s_mbit), rig.addr("b", "s"), flows)
    try:
        rig.start()
        for port in hop.ports:
            rig.shape(port)
        start_servers(rig, "b", hop.ip_b, sorted({f.port for f in flows}))
    except BaseException:
        rig.close()
        raise
    return hop


@pytest.fixture(scope="module")
def hop1() -> Iterator[OneHop]:
    flows = [Flow("a", 5201, 40, TOS_LOSSLESS), Flow("c", 5202, 30, TOS_LOSSLESS),
             Flow("a", 5203, LOSSY_MBIT, 0)]
    hop = None
    try:
        hop = one_hop("h1", LINK_MBIT, flows)
        yield hop
    finally:
        if hop is not None:
            hop.rig.close()


@pytest.fixture(scope="module")
def without_engine(hop1: OneHop) -> dict:
    result = run_phase(hop1.rig, hop1.ports, hop1.ip_b, hop1.flows, None)
    print(f"\n(a) no engine: S {result['delta'][hop1.s.dev]}")
    return result


@pytest.fixture(scope="module")
def with_engine(hop1: OneHop, pfcd_binary: Path,
                tmp_path_factory: pytest.TempPathFactory) -> dict:
    engine = Engine(hop1.rig, pfcd_binary, hop1.config(),
                    tmp_path_factory.mktemp("pfcd-hop1"))
    result = run_phase(hop1.rig, hop1.ports, hop1.ip_b, hop1.flows, engine)
    _print_engine_run("(b) engine on", hop1.rig, result, hop1.s, [hop1.a, hop1.c])
    return result


def _print_engine_run(title: str, rig: Rig, result: dict, watched: Port,
                      feeders: list[Port]) -> None:
    rep = result["pfcd"]
    w = counters(rig, rep, watched)
    goodput = result["delta"][watched.dev]["lossless_bytes"] * 8 / RUN_S / 1e6
    print(f"\n{title}: S {result['delta'][watched.dev]} lossless out {goodput:.1f} Mbit/s"
          f"\n  watched {watched.dev}: tx {w['pause_frames_tx']} xoff {w['xoff_events']} "
          f"max backlog {w['max_backlog_bytes']} headroom used {w['headroom_used_bytes']} "
          f"(headroom {HEADROOM}, limit {LOSSLESS_LIMIT}) drops {w['drops']} "
          f"(in xoff {w['drops_in_xoff']}, out of xoff {w['drops_out_of_xoff']})"
          f"\n  pause reaction ns {w['pause_reaction_ns']}"
          f"\n  resume reaction ns {w['resume_reaction_ns']}"
          f"\n  pfcd cpu/s {rep['cpu']['per_s']:.4f} (/proc {rep['cpu_per_s_proc']:.4f}) "
          f"polls {rep['polls']} late {rep['late_polls']} (max {rep['max_late_ns']} ns) "
          f"poll ns {rep['poll_ns']}")
    for f in feeders:
        c = counters(rig, rep, f)
        pauses = max(c["pauses"], 1)
        print(f"  feeder {f.dev}: rx {c['pause_frames_rx']} pauses {c['pauses']} "
              f"paused {c['paused_ns'] / 1e9:.3f} s leak {c['leak_bytes']} B "
              f"({c['leak_bytes'] / pauses:.0f} B/pause, {c['leak_packets']} pkts) "
              f"max debt {c['max_debt_ns'] / 1e6:.2f} ms other classes while paused "
              f"{c['other_bytes_while_paused']} B")


def test_bad_config_is_one_line_naming_the_field(pfcd_binary: Path, tmp_path: Path) -> None:
    cases = {
        "poll_us 10\n": "poll_us",
        "port - lo prio=3 class=1:10 leaf=10: xoff=100 xon=100\n": "port.xon",
        "port - lo prio=3 class=1:10 leaf=10: xoff=100 xon=10 burst=1\n": "port.burst",
        "port - lo prio=3 class=1:10 leaf=10: xoff=100 xon=10\n"
        "feeder - lo class=1:10 rate=1000 ceil=500 pause=8\n": "feeder.ceil",
        "port - lo prio=3 class=1:10 leaf=10: xoff=100 xon=10\n"
        "feeder - lo class=1:10 rate=1000 ceil=1000 pause=8\n": "feeder.class",
    }
    for text, field_name in cases.items():
        cfg = tmp_path / "bad.conf"
        cfg.write_text(text)
        r = subprocess.run([str(pfcd_binary), str(cfg), str(tmp_path / "out.json")],
                           capture_output=True, text=True, timeout=10)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, (text, r.returncode, r.stderr)
        assert f" {field_name}: " in lines[0], (text, lines)
        assert not (tmp_path / "out.json").exists()


def test_without_the_engine_the_lossless_class_drops(hop1: OneHop,
                                                     without_engine: dict) -> None:
    assert without_engine["delta"][hop1.s.dev]["drops"] > 0, without_engine["delta"]


def test_the_engine_keeps_the_lossless_class_lossless(hop1: OneHop, with_engine: dict,
                                                      without_engine: dict) -> None:
    rep, s = with_engine["pfcd"], with_engine["delta"][hop1.s.dev]
    w = counters(hop1.rig, rep, hop1.s)
    assert s["drops"] == 0, s
    assert w["drops"] == 0 and w["change_errors"] == 0, w
    assert w["xoff_events"] > 0 and w["pause_frames_tx"] >= 2 * w["xoff_events"], w
    for feeder in (hop1.a, hop1.c):
        assert counters(hop1.rig, rep, feeder)["pause_frames_rx"] >= w["xoff_events"]
    # lossless, not strangled: the port still carried most of what it can
    lossless_cap = hop1.s.mbit * 1e6 / 8 * RUN_S - s["lossy_bytes"]
    assert s["lossless_bytes"] > 0.7 * lossless_cap, (s, lossless_cap)
    assert w["pause_reaction_ns"]["p50"] < 1_000_000, w["pause_reaction_ns"]
    assert rep["cpu_per_s_proc"] < 0.3, rep["cpu"]


def test_a_paused_priority_stops_while_the_others_flow(hop1: OneHop,
                                                       with_engine: dict) -> None:
    """While A's lossless class was held paused, A's lossy class kept sending: pfcd read
    the port's other classes' byte counters at each pause and each resume."""
    a = counters(hop1.rig, with_engine["pfcd"], hop1.a)
    paused_s = a["paused_ns"] / 1e9
    assert a["pauses"] > 0 and paused_s > 0.2 * RUN_S, a
    other_bps = a["other_bytes_while_paused"] * 8 / paused_s
    assert other_bps > 0.8 * LOSSY_MBIT * 1e6, (other_bps, a)
    # and the paused class itself sent what htb lets it (README): the frame it may still
    # send when the pause lands, then one frame per frame time at the pause rate
    allowed = a["pauses"] + paused_s * PAUSE_BPS / 8 / WIRE_FRAME_BYTES
    assert 0 < a["leak_packets"] <= allowed, (allowed, a)
    lossy = with_engine["iperf"][2]
    assert lossy["lost_percent"] < 1, lossy


def test_a_near_zero_pause_rate_leaves_the_class_owing_time(pfcd_binary: Path,
                                                            tmp_path: Path) -> None:
    """What htb does with a class change, on packets: the frame a class still sends after
    being set to 8 bit/s is charged at 8 bit/s, and the class owes that time (htb clamps
    the debt at its 60 s mbuffer) after its rate is back. Its own rig: the class stays
    stalled after this test."""
    hop = one_hop("z0", 20, [Flow("a", 5201, 40, TOS_LOSSLESS)])
    try:
        engine = Engine(hop.rig, pfcd_binary, pfcd_config(hop.rig, [(hop.s, [hop.a])], 8),
                        tmp_path)
        # no drain: A's class, stalled by its debt, would not empty its queue for a minute
        result = run_phase(hop.rig, hop.ports, hop.ip_b, hop.flows, engine, drain=False)
        a = counters(hop.rig, result["pfcd"], hop.a)
        restored = hop.rig.class_stats(hop.a, "1:10")
        # the rate is back, the debt is not: A offers 40 Mbit/s for another second
        before = restored["bytes"]
        run_flows(hop.rig, hop.ip_b, hop.flows, 1)
        after = hop.rig.class_stats(hop.a, "1:10")
    finally:
        hop.rig.close()
    sent_after = after["bytes"] - before
    print(f"\n(z) pause at 8 bit/s: A pauses {a['pauses']} leak {a['leak_bytes']} B "
          f"max debt {a['max_debt_ns'] / 1e9:.1f} s; after the resume rate "
          f"{restored['rate']:.0f} bit/s tokens {restored.get('tokens')} ctokens "
          f"{restored.get('ctokens')} (64 ns ticks); sent in the next second {sent_after} B")
    assert a["pauses"] >= 1 and a["max_debt_ns"] > 30e9, a
    assert restored["rate"] == LOSSLESS_WEIGHT * hop.a.mbit * 1e6, restored
    assert sent_after < 4 * WIRE_FRAME_BYTES, (sent_after, after)


@pytest.fixture(scope="module")
def hop2() -> Iterator[tuple[Rig, Port, Port, Port]]:
    """A - S1 - S2 - B, the slow port at S2 (25 Mbit/s)."""
    rig = Rig(links=[("a", "s1"), ("s1", "s2"), ("s2", "b")], prefix="h2",
              routes=[("a", "default", "10.79.1.2"), ("s1", "default", "10.79.2.2"),
                      ("s2", "10.79.1.0/24", "10.79.2.1"), ("b", "default", "10.79.3.1")])
    ports = (Port("a", rig.dev("a", "s1"), lossless_limit=DEEP_LIMIT),
             Port("s1", rig.dev("s1", "s2")), Port("s2", rig.dev("s2", "b"), mbit=25))
    try:
        rig.start()
        for port in ports:
            rig.shape(port)
        start_servers(rig, "b", rig.addr("b", "s2"), [5201])
        yield (rig, *ports)
    finally:
        rig.close()


def test_the_pause_propagates_over_two_hops(hop2: tuple[Rig, Port, Port, Port],
                                            pfcd_binary: Path, tmp_path: Path) -> None:
    """S2's queue pauses S1's port; S1's port, held, fills its own queue, which pauses A:
    pause frames on both links, and neither switch's lossless queue drops."""
    rig, a, s1, s2 = hop2
    engine = Engine(rig, pfcd_binary, pfcd_config(rig, [(s2, [s1]), (s1, [a])], PAUSE_BPS),
                    tmp_path)
    result = run_phase(rig, [a, s1, s2], rig.addr("b", "s2"),
                       [Flow("a", 5201, 40, TOS_LOSSLESS)], engine)
    _print_engine_run("(c) two hops, S2", rig, result, s2, [s1])
    _print_engine_run("    two hops, S1", rig, result, s1, [a])
    rep = result["pfcd"]
    c_s2, c_s1, c_a = (counters(rig, rep, p) for p in (s2, s1, a))
    assert result["delta"][s2.dev]["drops"] == 0 and result["delta"][s1.dev]["drops"] == 0
    assert c_s2["pause_frames_tx"] > 0 and c_s1["pause_frames_rx"] > 0, (c_s2, c_s1)
    assert c_s1["pause_frames_tx"] > 0 and c_a["pause_frames_rx"] > 0, (c_s1, c_a)
    assert c_s1["paused_ns"] > 0 and c_a["paused_ns"] > 0, (c_s1, c_a)


def test_a_class_left_paused_by_a_killed_pfcd_is_restored(pfcd_binary: Path,
                                                          tmp_path: Path) -> None:
    """pfcd resumes its classes only in its SIGTERM handler: killed with SIGKILL while a
    class is paused, the class stays at the pause rate, and ``Pfcd.restore`` (what the
    controller does for a pfcd that died) gives it back its rate, ceil, burst, quantum and
    prio exactly as the lab made it. The feeder is C's port, idle: pausing it does not
    relieve S's queue, which A's flood keeps above XOFF, so the pause holds for the run."""
    hop = one_hop("k9", 20, [Flow("a", 5201, 40, TOS_LOSSLESS)])
    try:
        made = hop.rig.ns(hop.c.ns, "tc", "-d", "class", "show", "dev", hop.c.dev,
                          "classid", LOSSLESS_CLASS).stdout
        engine = Engine(hop.rig, pfcd_binary, pfcd_config(hop.rig, [(hop.s, [hop.c])],
                                                          PAUSE_BPS), tmp_path)
        flood = hop.rig.spawn(hop.a.ns, "iperf3", "-c", hop.ip_b, "-p", "5201", "-u", "-b",
                              "40M", "-l", "1472", "--tos", str(TOS_LOSSLESS), "-t",
                              str(RUN_S), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + RUN_S
        while hop.rig.class_stats(hop.c, LOSSLESS_CLASS)["rate"] != PAUSE_BPS:
            assert time.monotonic() < deadline, "pfcd never paused C's class"
            time.sleep(0.05)
        os.kill(engine.pfcd.pid, signal.SIGKILL)
        engine.pfcd.proc.wait(timeout=10)
        time.sleep(0.2)
        left = hop.rig.class_stats(hop.c, LOSSLESS_CLASS)["rate"]
        engine.pfcd.restore()
        restored = hop.rig.ns(hop.c.ns, "tc", "-d", "class", "show", "dev", hop.c.dev,
                              "classid", LOSSLESS_CLASS).stdout
        flood.wait(timeout=RUN_S + 30)
    finally:
        hop.rig.close()
    print(f"\n(k) pfcd killed: C's class left at {left:.0f} bit/s; restored: "
          f"{restored.strip()}")
    assert left == PAUSE_BPS
    assert restored == made and "rate 25Mbit ceil 50Mbit" in restored, (made, restored)
