"""The controller's test bench, built by hand (not by the lab): a tiny OVS fabric of two
leaves and two spines with one namespace host per leaf, the traffic programs run inside the
namespaces, and the controller process under either runtime (``test_controller_runtime``).

Everything created is named ``fct<tag>...`` and removed by ``Fabric.destroy``, by name and PID.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def ovs_running() -> bool:
    try:
        return all(subprocess.run(cmd, capture_output=True, timeout=5).returncode == 0
                   for cmd in (["ovs-vsctl", "--timeout=3", "show"],
                               ["ovs-appctl", "-t", "ovs-vswitchd", "version"]))
    except (OSError, subprocess.TimeoutExpired):
        return False


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


