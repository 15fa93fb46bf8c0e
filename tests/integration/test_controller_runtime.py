"""The controller on a real (tiny) OVS fabric, under both runtimes, with real packets.

The fabric is built here by hand, not by the lab, so this tests the controller alone:
two leaves and two spines as OVS userspace bridges joined by veth pairs, and one host per
leaf as a network namespace. Two spines (rather than two leaves joined by two links) give
every flow a path through one spine and *another path* through the other, so the switches'
own per-flow counters can say which one the packets took, and that the other saw nothing.

    ns1 --1-[leaf1]-2--1-[spine1]-2--2-[leaf2]-1-- ns2
               3 --1-[spine2]-2-- 3

Everything created is named ``fct<tag>...`` and removed by the fixture, by name and PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from controllers import policies
from controllers.policies import FlowKey

REPO = Path(__file__).resolve().parents[2]


def _ovs_running() -> bool:
    try:
        return all(subprocess.run(cmd, capture_output=True, timeout=5).returncode == 0
                   for cmd in (["ovs-vsctl", "--timeout=3", "show"],
                               ["ovs-appctl", "-t", "ovs-vswitchd", "version"]))
    except (OSError, subprocess.TimeoutExpired):
        return False


pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not _ovs_running(),
                                reason="needs root and a running Open vSwitch")


def runtime_python(runtime: str) -> str:
    """The interpreter the lab would use for ``runtime`` (os-ken: this venv's)."""
    if runtime == "os-ken":
        return sys.executable
    from lab.machine.environment import ryu_python
    return ryu_python()


RUNTIMES = ["os-ken", "ryu"]
POLICIES = ["ovs-select", "hash-l3", "hash5"]
SEED = 3
H1 = ("10.0.0.1", "00:00:00:00:00:01")
H2 = ("10.0.0.2", "00:00:00:00:00:02")
#: Port numbers: leaves 1 = host, 2 = spine1, 3 = spine2; spines 1 = leaf1, 2 = leaf2.
UPLINKS = {2: "spine1", 3: "spine2"}
UDP_PAYLOAD, UDP_COUNT = 1000, 20
UDP_FRAME = UDP_PAYLOAD + 8 + 20 + 14


def sh(*cmd: str, check: bool = True, timeout: float = 20) -> str:
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the fabric --------------------------------------------------------------------------------

@dataclass
class Fabric:
    """Names of everything this test creates; ``destroy`` removes exactly those."""

    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    bridges: list[str] = field(default_factory=list)
    veths: list[str] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def name(self, suffix: str) -> str:
        return f"fct{self.tag}{suffix}"

    @property
    def dpids(self) -> dict[str, int]:
        return {"leaf1": 0x201, "leaf2": 0x202, "spine1": 0x101, "spine2": 0x102}

    def br(self, switch: str) -> str:
        return self.name({"leaf1": "l1", "leaf2": "l2", "spine1": "s1", "spine2": "s2"}[switch])

    def ns(self, host: str) -> str:
        return self.name(f"n{host[-1]}")

    def _veth(self, a: str, b: str) -> None:
        sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        self.veths.append(a)
        for end in (a, b):
            sh("sysctl", "-qw", f"net.ipv6.conf.{end}.disable_ipv6=1")

    def create(self) -> None:
        for host, (ip, mac), peer in (("h1", H1, H2), ("h2", H2, H1)):
            ns = self.ns(host)
            sh("ip", "netns", "add", ns)
            self.netns.append(ns)
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
               "net.ipv6.conf.default.disable_ipv6=1")
            outer, inner = self.name(f"h{host[-1]}"), self.name(f"h{host[-1]}n")
            self._veth(outer, inner)
            sh("ip", "link", "set", inner, "netns", ns)
            for cmd in (["ip", "link", "set", inner, "address", mac],
                        ["ip", "addr", "add", f"{ip}/24", "dev", inner],
                        ["ip", "link", "set", inner, "up"], ["ip", "link", "set", "lo", "up"],
                        # Static ARP, as the lab does: no ARP packet ever reaches a switch.
                        ["ip", "neigh", "replace", peer[0], "lladdr", peer[1], "dev", inner,
                         "nud", "permanent"]):
                sh("ip", "netns", "exec", ns, *cmd)
            sh("ip", "link", "set", outer, "up")
        ports: dict[str, list[tuple[str, int]]] = {sw: [] for sw in self.dpids}
        ports["leaf1"].append((self.name("h1"), 1))
        ports["leaf2"].append((self.name("h2"), 1))
        for i, (leaf, lport, spine, sport) in enumerate(
                [("leaf1", 2, "spine1", 1), ("leaf1", 3, "spine2", 1),
                 ("leaf2", 2, "spine1", 2), ("leaf2", 3, "spine2", 2)]):
            a, b = self.name(f"v{i}a"), self.name(f"v{i}b")
            self._veth(a, b)
            ports[leaf].append((a, lport))
            ports[spine].append((b, sport))
            for end in (a, b):
                sh("ip", "link", "set", end, "up")
        for sw, dpid in self.dpids.items():
            br = self.br(sw)
            cmd = ["ovs-vsctl", "--timeout=10", "add-br", br, "--", "set", "bridge", br,
                   "datapath_type=netdev", "protocols=OpenFlow13", "fail_mode=secure",
                   f"other-config:datapath-id={dpid:016x}",
                   "other-config:disable-in-band=true"]
            self.bridges.append(br)
            for intf, port in ports[sw]:
                cmd += ["--", "add-port", br, intf, "--", "set", "interface", intf,
                        f"ofport_request={port}"]
            sh(*cmd)

    def connect(self, port: int) -> None:
        for br in self.bridges:
            sh("ovs-vsctl", "--timeout=10", "set-controller", br, f"tcp:127.0.0.1:{port}")

    def destroy(self) -> None:
        for proc in self.procs:                  # only the PIDs this test started
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for br in self.bridges:
            sh("ovs-vsctl", "--timeout=10", "--if-exists", "del-br", br, check=False)
        for veth in self.veths:
            if Path(f"/sys/class/net/{veth}").exists():
                sh("ip", "link", "del", veth, check=False)
        for ns in self.netns:
            sh("ip", "netns", "del", ns, check=False)

    def config(self, policy: str, sock: Path) -> dict[str, Any]:
        links = [{"a": leaf, "a_port": lp, "b": spine, "b_port": sp}
                 for leaf, lp, spine, sp in [("leaf1", 2, "spine1", 1), ("leaf1", 3, "spine2", 1),
                                             ("leaf2", 2, "spine1", 2), ("leaf2", 3, "spine2", 2)]]
        return {"policy": policy, "seed": SEED, "control_socket": str(sock),
                "switches": [{"name": n, "dpid": d} for n, d in self.dpids.items()],
                "hosts": [{"name": "h1", "ip": H1[0], "mac": H1[1], "switch": "leaf1", "port": 1},
                          {"name": "h2", "ip": H2[0], "mac": H2[1], "switch": "leaf2",
                           "port": 1}],
                "links": links}

    # -- reading the switches ---------------------------------------------------------------
    def flows(self, switch: str, table: int) -> list[str]:
        out = sh("ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", self.br(switch),
                 f"table={table}")
        lines = (re.sub(r"^table=\d+, ", "", " ".join(x.split())) for x in out.splitlines())
        return sorted(x for x in lines if "priority=" in x)

    def groups(self, switch: str) -> list[str]:
        out = sh("ovs-ofctl", "-O", "OpenFlow13", "dump-groups", self.br(switch))
        return [line.strip() for line in out.splitlines() if "group_id=" in line]

    def counters(self, switch: str) -> dict[int, tuple[int, int]]:
        """{cookie: (n_packets, n_bytes)} of the watch entries in table 0."""
        out = sh("ovs-ofctl", "-O", "OpenFlow13", "dump-flows", self.br(switch), "table=0")
        found = {}
        for line in out.splitlines():
            m = re.search(r"cookie=(0x[0-9a-f]+).*n_packets=(\d+), n_bytes=(\d+)", line)
            if m and int(m.group(1), 16):
                found[int(m.group(1), 16)] = (int(m.group(2)), int(m.group(3)))
        return found

    def settled_counters(self, cookies: set[int], timeout: float = 5.0
                         ) -> dict[str, dict[int, tuple[int, int]]]:
        """Counters once they stop moving: OVS's revalidators copy datapath statistics into
        OpenFlow entries only every ~500 ms, so a read right after traffic is short."""
        deadline = time.monotonic() + timeout
        last: dict[str, dict[int, tuple[int, int]]] = {}
        while True:
            time.sleep(0.6)
            now = {sw: {c: v for c, v in self.counters(sw).items() if c in cookies}
                   for sw in self.dpids}
            if now == last or time.monotonic() > deadline:
                return now
            last = now

    def spawn_in_ns(self, host: str, code: str, *args: str) -> subprocess.Popen[str]:
        """A background listener in ``host``'s namespace, returned once it is listening."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(host), sys.executable, "-c",
                                 code, *args], stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
        return proc

    def in_ns(self, host: str, code: str, *args: str, timeout: float = 30) -> str:
        return sh("ip", "netns", "exec", self.ns(host), sys.executable, "-c", code, *args,
                  timeout=timeout)


# -- traffic generated inside the namespaces (there is no ping binary on the machine) -------

PING = r"""
import socket, struct, sys, time
dst, count = sys.argv[1], int(sys.argv[2])
def csum(b):
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xFFFF); s += s >> 16
    return ~s & 0xFFFF
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
s.settimeout(2)
ident, got = 0x4654, 0
for seq in range(count):
    body = struct.pack("!BBHHH", 8, 0, 0, ident, seq) + b"fabriclab-ping!!"
    pkt = body[:2] + struct.pack("!H", csum(body)) + body[4:]
    t0 = time.monotonic(); s.sendto(pkt, (dst, 0))
    try:
        while True:
            data, addr = s.recvfrom(2048)
            ihl = (data[0] & 0xF) * 4
            typ, _, _, rid, rseq = struct.unpack("!BBHHH", data[ihl:ihl + 8])
            if typ == 0 and rid == ident and rseq == seq and addr[0] == dst:
                got += 1
                print("reply seq=%d rtt=%.2f ms" % (seq, (time.monotonic() - t0) * 1e3))
                break
    except socket.timeout:
        print("timeout seq=%d" % seq)
print("received", got, "of", count)
sys.exit(0 if got == count else 1)
"""

UDP_SEND = r"""
import socket, sys, time
src, dst = sys.argv[1], sys.argv[3]
sport, dport, n, size = (int(sys.argv[i]) for i in (2, 4, 5, 6))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((src, sport))
for _ in range(n):
    s.sendto(b"x" * size, (dst, dport)); time.sleep(0.005)
"""

UDP_RECV = r"""
import collections, json, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2]))); s.settimeout(10)
print("listening", flush=True)
got = collections.Counter()
try:
    while True:
        data, (_, sport) = s.recvfrom(65536)
        got[sport] += 1
        s.settimeout(1.5)
except socket.timeout:
    pass
print(json.dumps(got))
"""

TCP_SERVER = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(30)
print("listening", flush=True)
c, _ = s.accept(); total = 0
while True:
    b = c.recv(65536)
    if not b: break
    total += len(b)
c.sendall(str(total).encode()); c.close(); print(total)
"""

TCP_CLIENT = r"""
import socket, sys, time
src, dst = sys.argv[1], sys.argv[3]
sport, dport, size = (int(sys.argv[i]) for i in (2, 4, 5))
c = socket.socket(); c.bind((src, sport)); c.settimeout(20)
t0 = time.monotonic(); c.connect((dst, dport)); connect_s = time.monotonic() - t0
c.sendall(b"y" * size); c.shutdown(socket.SHUT_WR)
print(c.recv(100).decode(), "%.3f" % connect_s)
"""


# -- the controller process --------------------------------------------------------------------

@dataclass
class Controller:
    runtime: str
    proc: subprocess.Popen[bytes]
    port: int
    sock: Path
    log: Path
    started: float

    def request(self, msg: dict[str, Any] | bytes, timeout: float = 30) -> dict[str, Any]:
        line = msg if isinstance(msg, bytes) else json.dumps(msg).encode()
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(timeout)
            s.connect(str(self.sock))
            s.sendall(line + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(65536)
                assert chunk, "controller closed the control connection without a reply"
                buf += chunk
        return json.loads(buf)

    def wait_socket(self, timeout: float = 30) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"controller exited: {self.log.read_text()}"
            if self.sock.exists():
                with contextlib.suppress(OSError):
                    self.request({"cmd": "status"})
                    return time.monotonic() - self.started
            time.sleep(0.02)
        raise AssertionError(f"no control socket after {timeout} s: {self.log.read_text()}")

    def wait(self, pred: Any, what: str, timeout: float = 20) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status = self.request({"cmd": "status"})
            if pred(status):
                return status
            time.sleep(0.02)
        raise AssertionError(f"{what} not reached in {timeout} s: {status}\n"
                             f"{self.log.read_text()[-3000:]}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return -9
        return self.proc.returncode


def start_controller(runtime: str, cfg: dict[str, Any], tmp: Path) -> Controller:
    cfg_path, log = tmp / "controller.json", tmp / "controller.log"
    cfg_path.write_text(json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    port = free_port()
    started = time.monotonic()
    proc = subprocess.Popen([runtime_python(runtime), "-m", "controllers.launch", "--runtime",
                             runtime, "--config", str(cfg_path), "--ofp-port", str(port),
                             "--log", str(log), "--log-level", "debug"],
                            cwd=str(REPO), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    return Controller(runtime, proc, port, Path(cfg["control_socket"]), log, started)


@pytest.fixture
def fabric() -> Iterator[Fabric]:
    fab = Fabric()
    try:
        fab.create()
        yield fab
    finally:
        fab.destroy()


@pytest.fixture
def controllers() -> Iterator[list[Controller]]:
    """Started controllers are registered here; any still running at the end are killed."""
    started: list[Controller] = []
    yield started
    for ctl in started:
        if ctl.proc.poll() is None:
            ctl.proc.kill()             # only the PID this test started
            ctl.proc.wait()


def bring_up(runtime: str, policy: str, fab: Fabric, tmp: Path,
             started: list[Controller]) -> tuple[Controller, dict[str, float]]:
    ctl = start_controller(runtime, fab.config(policy, tmp / "controller.sock"), tmp)
    started.append(ctl)
    timings = {"socket_s": ctl.wait_socket()}
    status = ctl.request({"cmd": "status"})
    assert set(status["switches"].values()) == {"absent"} and status["ready"] is False
    t0 = time.monotonic()
    fab.connect(ctl.port)
    ctl.wait(lambda s: s["ready"], "all switches programmed")
    timings["ready_s"] = time.monotonic() - t0
    timings["start_to_ready_s"] = time.monotonic() - ctl.started
    print(f"\n[{runtime}/{policy}] control socket after {timings['socket_s']:.2f} s, "
          f"switches programmed {timings['ready_s']:.2f} s after set-controller "
          f"({timings['start_to_ready_s']:.2f} s from start)")
    return ctl, timings


def listening(pid: int) -> list[str]:
    """Local addresses of the TCP listeners and UDP sockets of process ``pid``."""
    addrs = []
    for flags in ("-ltnpH", "-lunpH", "-uanpH"):
        for line in sh("ss", flags).splitlines():
            if f"pid={pid}," in line:
                addrs.append(line.split()[3])
    return addrs


# -- tests ---------------------------------------------------------------------------------------

def check_tables(fab: Fabric, policy: str) -> None:
    """What ``dump-flows``/``dump-groups`` must show right after programming."""
    to_h1, to_h2 = "ip,nw_dst=10.0.0.1", "ip,nw_dst=10.0.0.2"
    for sw in fab.dpids:
        assert fab.flows(sw, 0) == ["priority=0 actions=goto_table:1"], sw
    for spine in ("spine1", "spine2"):
        assert fab.flows(spine, 1) == [f"priority=10,{to_h1} actions=output:1",
                                       f"priority=10,{to_h2} actions=output:2"]
        assert fab.groups(spine) == []
    leaf1 = fab.flows("leaf1", 1)
    assert f"priority=10,{to_h1} actions=output:1" in leaf1
    if policy == "ovs-select":
        assert leaf1 == sorted([f"priority=10,{to_h1} actions=output:1",
                                f"priority=10,{to_h2} actions=group:1"])
        (group,) = fab.groups("leaf1")
        assert "group_id=1,type=select" in group
        buckets = re.findall(r"bucket=([^ ]*?)(?=,bucket=|$)", group)
        assert len(buckets) == 2, group
        for port, bucket in zip((2, 3), buckets, strict=True):
            # OVS prints a bucket's weight only when it is not the default, 1.
            assert "weight:" not in bucket and f"watch_port:{port}" in bucket, bucket
            assert bucket.endswith(f"actions=output:{port}"), bucket
    elif policy == "hash-l3":
        want = policies.get("hash-l3")(SEED).choose(FlowKey(H1[0], H2[0], 0, 0, 0), "leaf1",
                                                     [2, 3])
        assert leaf1 == sorted([f"priority=10,{to_h1} actions=output:1",
                                f"priority=20,ip,nw_src=10.0.0.1,nw_dst=10.0.0.2 "
                                f"actions=output:{want}",
                                f"priority=10,{to_h2} actions=output:2"])
        assert fab.groups("leaf1") == []
    else:
        # TCP and UDP wait for the policy's decision; everything else (ICMP) takes the
        # select group, so reachability never queues at the controller.
        assert leaf1 == sorted([f"priority=10,{to_h1} actions=output:1",
                                f"priority=10,{to_h2} actions=group:1",
                                "priority=15,tcp,nw_dst=10.0.0.2 actions=CONTROLLER:65535",
                                "priority=15,udp,nw_dst=10.0.0.2 actions=CONTROLLER:65535"])
        (group,) = fab.groups("leaf1")
        assert "group_id=1,type=select" in group
    for sw in fab.dpids:
        for line in fab.flows(sw, 1):
            assert "FLOOD" not in line and "NORMAL" not in line and "ALL" not in line


def predicted_spine(policy: str, key: FlowKey, first: str) -> str | None:
    """The spine a flow must cross, when the controller (not OVS) decides."""
    if policy == "ovs-select":
        return None
    if policy == "hash-l3":
        key = FlowKey(key.src, key.dst, 0, 0, 0)
    return UPLINKS[policies.get(policy)(SEED).choose(key, first, [2, 3])]


def check_path(all_counts: dict[str, dict[int, tuple[int, int]]], policy: str, cookie: int,
               key: FlowKey, first: str, last: str, min_bytes: int,
               exact: tuple[int, int] | None = None) -> str:
    """The watch counters say the flow crossed both leaves and exactly one spine."""
    counts = {sw: c.get(cookie, (0, 0)) for sw, c in all_counts.items()}
    crossed = [sp for sp in ("spine1", "spine2") if counts[sp][1] > 0]
    assert len(crossed) == 1, f"cookie {cookie:#x}: {counts}"
    other = "spine2" if crossed[0] == "spine1" else "spine1"
    assert counts[other] == (0, 0), counts
    for sw in (first, crossed[0], last):
        assert counts[sw][1] >= min_bytes, (sw, counts)
        if exact is not None:
            assert counts[sw] == exact, (sw, counts)
    want = predicted_spine(policy, key, first)
    if want is not None:
        assert crossed[0] == want, f"{key} took {crossed[0]}, the policy chose {want}"
    return crossed[0]


def pick_sports(policy: str) -> tuple[int, int]:
    """Two UDP source ports that the policy (if it decides) sends over different spines."""
    if policy != "hash5":
        return 40001, 40002
    first = 40001
    want = predicted_spine(policy, FlowKey(H1[0], H2[0], 17, first, 5001), "leaf1")
    for sport in range(40002, 40100):
        if predicted_spine(policy, FlowKey(H1[0], H2[0], 17, sport, 5001), "leaf1") != want:
            return first, sport
    raise AssertionError("no second port found")


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_programs_forwards_and_counts(runtime: str, policy: str, fabric: Fabric,
                                      controllers: list[Controller], tmp_path: Path) -> None:
    ctl, _ = bring_up(runtime, policy, fabric, tmp_path, controllers)
    status = ctl.request({"cmd": "status"})
    assert (status["ok"], status["runtime"], status["policy"], status["seed"]) == \
        (True, runtime, policy, SEED)
    assert status["switches"] == dict.fromkeys(fabric.dpids, "programmed")
    assert oct(ctl.sock.stat().st_mode & 0o777) == "0o600"

    # Only 127.0.0.1: the OpenFlow listener, nothing else on any network.
    addrs = listening(ctl.proc.pid)
    assert addrs == [f"127.0.0.1:{ctl.port}"], addrs

    check_tables(fabric, policy)

    # Real packets both ways (ICMP: a protocol without ports, so flow keys with ports 0).
    print(fabric.in_ns("h1", PING, H2[0], "3").strip())
    print(fabric.in_ns("h2", PING, H1[0], "3").strip())

    # Per-flow counters: two UDP flows, a TCP flow both ways, and one that never runs.
    s1, s2 = pick_sports(policy)
    udp = [FlowKey(H1[0], H2[0], 17, s1, 5001), FlowKey(H1[0], H2[0], 17, s2, 5001)]
    tcp = FlowKey(H1[0], H2[0], 6, 40100, 5201)
    idle = FlowKey(H2[0], H1[0], 17, 5001, s1)
    watched = {0xFAB1: udp[0], 0xFAB2: udp[1], 0xFAB3: tcp, 0xFAB4: tcp.reversed(),
               0xFAB5: idle}
    reply = ctl.request({"cmd": "watch", "flows": [
        {"cookie": c, "proto": k.proto, "src": k.src, "dst": k.dst, "sport": k.sport,
         "dport": k.dport} for c, k in watched.items()]})
    assert reply == {"ok": True, "installed": len(watched) * 4}
    for sw in fabric.dpids:
        assert set(fabric.counters(sw)) == set(watched), sw
        assert all(v == (0, 0) for v in fabric.counters(sw).values())
    table0 = fabric.flows("leaf1", 0)
    assert ("cookie=0xfab3, priority=100,tcp,nw_src=10.0.0.1,nw_dst=10.0.0.2,tp_src=40100,"
            "tp_dst=5201 actions=goto_table:1") in [re.sub(r"duration=[^ ]* ", "", x)
                                                     for x in table0], table0

    # Receivers count what the *hosts* accept, not just what the switches forwarded: a
    # packet-out with a broken checksum is counted by every switch and then dropped.
    receiver = fabric.spawn_in_ns("h2", UDP_RECV, H2[0], "5001")
    server = fabric.spawn_in_ns("h2", TCP_SERVER, tcp.dst, str(tcp.dport))
    for key in udp:
        fabric.in_ns("h1", UDP_SEND, key.src, str(key.sport), key.dst, str(key.dport),
                     str(UDP_COUNT), str(UDP_PAYLOAD))
    size = 300_000
    got, connect_s = fabric.in_ns("h1", TCP_CLIENT, tcp.src, str(tcp.sport), tcp.dst,
                                  str(tcp.dport), str(size)).split()
    assert got == str(size)
    # No SYN or SYN-ACK lost on the way (each loss costs a 1 s retransmission timeout).
    assert float(connect_s) < 0.5, f"TCP connect took {connect_s} s"
    assert server.communicate(timeout=10)[0].split()[-1] == str(size)
    received = json.loads(receiver.communicate(timeout=15)[0].splitlines()[-1])
    assert received == {str(k.sport): UDP_COUNT for k in udp}, received
    counts = fabric.settled_counters(set(watched))
    spines = [check_path(counts, policy, c, k, "leaf1", "leaf2", UDP_COUNT * UDP_FRAME,
                         exact=(UDP_COUNT, UDP_COUNT * UDP_FRAME))
              for c, k in ((0xFAB1, udp[0]), (0xFAB2, udp[1]))]
    fwd = check_path(counts, policy, 0xFAB3, tcp, "leaf1", "leaf2", size)
    rev = check_path(counts, policy, 0xFAB4, tcp.reversed(), "leaf2", "leaf1", 1)
    assert all(counts[sw][0xFAB5] == (0, 0) for sw in fabric.dpids)
    print(f"[{runtime}/{policy}] UDP flows via {spines}, TCP via {fwd} / back via {rev}")
    if policy == "hash5":
        assert spines[0] != spines[1]          # per-flow hashing split them, as predicted
    if policy == "hash-l3":
        assert spines[0] == spines[1] == fwd   # one host pair, one uplink: polarised

    if policy == "hash5":
        # The decisions became exact, expiring entries on the leaves only.
        reactive = [x for x in fabric.flows("leaf1", 1) if "priority=30" in x]
        assert any("udp" in x and f"tp_src={s1}" in x and "idle_timeout=30" in x
                   for x in reactive), reactive
        assert any("tcp" in x and "tp_src=40100" in x for x in reactive), reactive
        assert not [x for x in fabric.flows("spine1", 1) if "priority=30" in x]
        assert ctl.request({"cmd": "status"})["decisions"] >= 4
        assert "port" in ctl.log.read_text()   # decisions logged at debug level

    assert ctl.stop() == 0
    assert not ctl.sock.exists(), "the control socket outlived the controller"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_reconnect_is_a_clean_resync(runtime: str, fabric: Fabric,
                                     controllers: list[Controller], tmp_path: Path) -> None:
    ctl, _ = bring_up(runtime, "ovs-select", fabric, tmp_path, controllers)
    key = FlowKey(H1[0], H2[0], 17, 40001, 5001)
    assert ctl.request({"cmd": "watch", "flows": [
        {"cookie": 0xFAB9, "proto": 17, "src": key.src, "dst": key.dst, "sport": key.sport,
         "dport": key.dport}]})["installed"] == 4
    before = fabric.flows("leaf1", 1), fabric.flows("leaf1", 0)
    br = fabric.br("leaf1")
    # Stale state the controller must not keep: a flow and a group it never installed.
    sh("ovs-vsctl", "del-controller", br)
    ctl.wait(lambda s: s["switches"]["leaf1"] == "absent", "leaf1 seen as disconnected")
    sh("ovs-ofctl", "-O", "OpenFlow13", "add-flow", br,
       "table=1,priority=5,cookie=0x77,ip,nw_dst=10.9.9.9,actions=drop")
    sh("ovs-ofctl", "-O", "OpenFlow13", "add-group", br,
       "group_id=77,type=select,bucket=output:2")
    assert any("10.9.9.9" in x for x in fabric.flows("leaf1", 1))
    fabric_ctl = f"tcp:127.0.0.1:{ctl.port}"
    sh("ovs-vsctl", "set-controller", br, fabric_ctl)
    ctl.wait(lambda s: s["ready"], "leaf1 programmed again")
    assert not any("10.9.9.9" in x for x in fabric.flows("leaf1", 1))
    assert not any("group_id=77" in g for g in fabric.groups("leaf1"))
    after = fabric.flows("leaf1", 1), fabric.flows("leaf1", 0)
    strip = [[re.sub(r"duration=[^ ]* ", "", x) for x in t] for t in (*before, *after)]
    assert strip[0] == strip[2] and strip[1] == strip[3]        # watch entry reinstalled
    assert "leaf1 (dpid 0x201) connected" in ctl.log.read_text()
    fabric.in_ns("h1", UDP_SEND, key.src, str(key.sport), key.dst, str(key.dport), "5", "100")
    assert fabric.settled_counters({0xFAB9})["leaf1"][0xFAB9] == (5, 5 * (100 + 42))
    assert ctl.stop() == 0


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_control_errors_and_unknown_switches(runtime: str, fabric: Fabric,
                                             controllers: list[Controller],
                                             tmp_path: Path) -> None:
    cfg = fabric.config("hash5", tmp_path / "controller.sock")
    cfg["switches"] = [s for s in cfg["switches"] if s["name"] != "spine2"]
    cfg["links"] = [lk for lk in cfg["links"] if lk["b"] != "spine2"]
    cfg["ecn"] = {"mechanism": "tc-bpf", "build_dir": str(tmp_path)}
    ctl = start_controller(runtime, cfg, tmp_path)
    controllers.append(ctl)
    ctl.wait_socket()
    bad_json = ctl.request(b"{not json")
    assert bad_json["ok"] is False and bad_json["error"].startswith("bad JSON"), bad_json
    assert ctl.request(b"[1]") == {"ok": False, "error": "bad request: expected a JSON object"}
    assert ctl.request({"cmd": "reboot"}) == {
        "ok": False, "error": "unknown cmd 'reboot' (known: status, watch, pin, ecn, ecn_stats)"}
    bad = ctl.request({"cmd": "watch", "flows": [{"cookie": 1, "proto": 6, "src": "10.0.0.1",
                                                  "dst": "nowhere"}]})
    assert bad["ok"] is False and "flows[0].dst" in bad["error"]
    pin = ctl.request({"cmd": "pin", "flows": [{"proto": 6, "src": "10.0.0.1",
                                                "dst": "10.0.0.5", "switch": "spine2",
                                                "port": 1}]})
    assert pin["ok"] is False and "flows[0].switch" in pin["error"], pin
    ecn = ctl.request({"cmd": "ecn", "ports": [{"intf": "leaf9-eth3", "k_bytes": 30000}]})
    assert ecn["ok"] is False and "ports[0].intf" in ecn["error"], ecn
    fabric.connect(ctl.port)
    # spine2 is not in this config: it connects but is left alone (and stays empty).
    ctl.wait(lambda s: s["ready"], "configured switches programmed")
    assert fabric.flows("spine2", 0) == [] and fabric.flows("spine2", 1) == []
    assert "dpid 0x102" in ctl.log.read_text() and "not in the config" in ctl.log.read_text()
    # Several requests on one connection, one reply line each.
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(ctl.sock))
        s.sendall(b'{"cmd": "status"}\n{"cmd": "nope"}\n')
        buf = b""
        while buf.count(b"\n") < 2:
            buf += s.recv(65536)
    first, second = (json.loads(x) for x in buf.splitlines())
    assert first["ready"] is True and second["ok"] is False
    assert ctl.stop() == 0


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_bad_config_fails_fast(runtime: str, tmp_path: Path) -> None:
    cfg_path = tmp_path / "bad.json"
    cfg_path.write_text(json.dumps({"policy": "foo", "control_socket": "/tmp/x",
                                    "switches": [], "hosts": [], "links": []}))
    r = subprocess.run([runtime_python(runtime), "-m", "controllers.launch", "--runtime",
                        runtime, "--config", str(cfg_path), "--ofp-port", str(free_port())],
                       cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    known = ", ".join(policies.available())
    assert f"policy: unknown policy 'foo' (known: {known})" in r.stderr


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_runtime_shim_exports_and_never_imports_ryu_wsgi(runtime: str) -> None:
    code = ("import sys; from controllers import runtime as r; "
            "names = ['app_manager', 'ofp_event', 'CONFIG_DISPATCHER', 'MAIN_DISPATCHER', "
            "'DEAD_DISPATCHER', 'set_ev_cls', 'ofproto_v1_3', 'hub', 'cfg', 'packet', "
            "'ethernet', 'ipv4', 'tcp', 'udp', 'icmp', 'RUNTIME_NAME', 'RUNTIME_VERSION']; "
            "missing = [n for n in names if not hasattr(r, n)]; "
            "import controllers.fabric_app; "
            "w = sys.modules.get('ryu.app.wsgi'); "
            "print(r.RUNTIME_NAME, r.RUNTIME_VERSION, r.ofp_event.__name__.split('.')[0], "
            "missing, 'placeholder' if w is None or getattr(w, 'FABRICLAB_PLACEHOLDER', 0) "
            "else 'REAL', 'webob' in sys.modules)")
    out = subprocess.run([runtime_python(runtime), "-W", "ignore", "-c", code], cwd=str(REPO),
                         env=dict(os.environ, PYTHONPATH=str(REPO), FABRICLAB_RUNTIME=runtime),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    name, version, pkg, missing, wsgi, webob = out.stdout.split(maxsplit=5)
    assert (name, pkg, missing) == (runtime, {"os-ken": "os_ken", "ryu": "ryu"}[runtime], "[]")
    assert version[0].isdigit()
    assert wsgi == "placeholder" and webob.strip() == "False"
