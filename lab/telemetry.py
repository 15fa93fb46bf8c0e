"""Per-port counters sampled into time series, qdisc drops and backlog, CPU headroom.

Every switch egress port is one end of a veth pair in the root namespace, so the kernel's
own interface counters (``/sys/class/net/<if>/statistics``) are exactly what crossed that
emulated link, and the htb/bfifo qdisc on it holds the configured queue's drops and backlog.
Reading sysfs is cheap enough for 10 Hz and more on 2 cores; qdisc stats come from one
``tc -s -j qdisc show`` per sample for all ports at once.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Port:
    """A switch egress port and the link it drives."""

    node: str
    port: int
    peer: str
    intf: str
    bw_mbps: float


@dataclass
class PortSnapshot:
    tx_bytes: int
    tx_packets: int
    tx_dropped: int
    qdisc_drops: int
    backlog_bytes: int
    up: bool = True


def read_counter(intf: str, name: str) -> int:
    try:
        with open(f"/sys/class/net/{intf}/statistics/{name}") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


def operstate(intf: str) -> str:
    try:
        with open(f"/sys/class/net/{intf}/operstate") as f:
            return f.read().strip()
    except OSError:
        return "absent"


def qdisc_stats(prefix: tuple[str, ...] = ()) -> dict[str, tuple[int, int]]:
    """{dev: (drops, backlog bytes)} of each root qdisc in the root namespace (or wherever
    ``prefix``, e.g. ``nsenter -t PID -n``, runs ``tc``)."""
    out = subprocess.run([*prefix, "tc", "-s", "-j", "qdisc", "show"], capture_output=True,
                         text=True, timeout=30)
    stats: dict[str, tuple[int, int]] = {}
    try:
        entries = json.loads(out.stdout or "[]")
    except ValueError:
        return stats
    for q in entries:
        if q.get("root"):
            stats[q["dev"]] = (int(q.get("drops", 0)), int(q.get("backlog", 0)))
    return stats


def snapshot(ports: list[Port]) -> dict[Port, PortSnapshot]:
    q = qdisc_stats()
    snap = {}
    for p in ports:
        drops, backlog = q.get(p.intf, (0, 0))
        snap[p] = PortSnapshot(read_counter(p.intf, "tx_bytes"),
                               read_counter(p.intf, "tx_packets"),
                               read_counter(p.intf, "tx_dropped"), drops, backlog,
                               operstate(p.intf) == "up")
    return snap


def drained_snapshot(ports: list[Port], timeout_s: float = 3.0,
                     poll_s: float = 0.05) -> dict[Port, PortSnapshot]:
    """A snapshot once every queue is empty and no port is sending any more.

    Senders stop when their last byte is handed to the network, not when it arrives; bytes
    still queued at that moment were counted where they entered the fabric but not yet on
    the links (measured: up to a queue's worth, 120 kB, per port). Waiting for the queues
    to drain makes the link and flow counters describe the same packets.
    """
    prev = snapshot(ports)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        cur = snapshot(ports)
        if all(c.backlog_bytes == 0 and c.tx_bytes == prev[p].tx_bytes
               for p, c in cur.items()):
            return cur
        prev = cur
    return prev


def cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies over all CPUs, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return idle, sum(fields[:8])


@dataclass
class Series:
    t: list[float] = field(default_factory=list)
    tx_bps: list[float] = field(default_factory=list)
    queue_bytes: list[int] = field(default_factory=list)


class Sampler(threading.Thread):
    """Samples every port at ``hz`` into per-port series, and CPU idle per second."""

    def __init__(self, ports: list[Port], hz: float = 10.0) -> None:
        super().__init__(daemon=True, name="fabriclab-sampler")
        self.ports = ports
        self.period = 1.0 / hz
        self.series: dict[Port, Series] = {p: Series() for p in ports}
        #: (time since t0, idle jiffies, total jiffies) at every sample.
        self.cpu: list[tuple[float, int, int]] = []
        self._stop_evt = threading.Event()
        self.t0 = 0.0

    def run(self) -> None:
        self.t0 = time.monotonic()
        prev = snapshot(self.ports)
        prev_t = self.t0
        self.cpu.append((0.0, *cpu_times()))
        next_t = self.t0 + self.period
        while not self._stop_evt.is_set():
            delay = next_t - time.monotonic()
            if delay > 0 and self._stop_evt.wait(delay):
                break
            next_t += self.period
            now = time.monotonic()
            cur = snapshot(self.ports)
            dt = max(now - prev_t, 1e-6)
            for p in self.ports:
                s = self.series[p]
                s.t.append(round(now - self.t0, 4))
                s.tx_bps.append((cur[p].tx_bytes - prev[p].tx_bytes) * 8 / dt)
                s.queue_bytes.append(cur[p].backlog_bytes)
            prev, prev_t = cur, now
            self.cpu.append((now - self.t0, *cpu_times()))

    def cpu_idle_pct(self, t_from: float, t_to: float, window_s: float = 1.0) -> list[float]:
        """Idle CPU (all cores) in consecutive ``window_s`` windows between two sample times.

        Windows start at ``t_from`` (the traffic phase), so the lab's own set-up before it
        does not count against the emulation; a final partial window shorter than half a
        window is dropped as too noisy.
        """
        out = []
        pts = [c for c in self.cpu if t_from - self.period <= c[0] <= t_to + self.period]
        i = 0
        while i < len(pts) - 1:
            j = i
            while j < len(pts) - 1 and pts[j][0] - pts[i][0] < window_s:
                j += 1
            span = pts[j][0] - pts[i][0]
            total = pts[j][2] - pts[i][2]
            if span >= window_s / 2 and total > 0:
                out.append(100.0 * (pts[j][1] - pts[i][1]) / total)
            i = j
        return out

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=5)


def fabric_ports(topo_desc: dict) -> list[Port]:
    """Every switch egress port of a described topology (one ``links`` entry each)."""
    switches = {s["name"] for s in topo_desc["switches"]}
    ports = []
    for link in topo_desc["links"]:
        for node, port, peer in ((link["a"], link["a_port"], link["b"]),
                                 (link["b"], link["b_port"], link["a"])):
            if node in switches:
                ports.append(Port(node, port, peer, f"{node}-eth{port}", link["bw_mbps"]))
    return sorted(ports, key=lambda p: (p.node, p.port))


def flow_counters(bridge: str) -> dict[int, tuple[int, int]]:
    """{cookie: (packets, bytes)} of the per-flow counter entries in table 0 of ``bridge``.

    Read with ``ovs-ofctl``: these are the switch's own counters for exactly the packets
    that matched the flow's 5-tuple there.
    """
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", bridge, "table=0"],
                         capture_output=True, text=True)
    counters: dict[int, tuple[int, int]] = {}
    for line in out.stdout.splitlines():
        line = line.strip()
        if not line.startswith("cookie="):
            continue
        fields = dict(kv.split("=", 1) for kv in line.split(", ") if "=" in kv)
        cookie = int(fields["cookie"], 16)
        if cookie == 0:
            continue
        counters[cookie] = (int(fields.get("n_packets", 0)), int(fields.get("n_bytes", 0)))
    return counters


def settled_flow_counters(bridges: list[str], quiet_s: float = 0.6,
                          timeout_s: float = 4.0) -> dict[str, dict[int, tuple[int, int]]]:
    """Per-flow counters of every bridge once they stop moving.

    OVS attributes datapath traffic to OpenFlow rules in revalidator rounds (about every
    500 ms), so a read right after traffic stops misses the last few hundred milliseconds -
    measured: 3-4 % of a 4 s flow. Reading until two reads ``quiet_s`` apart agree fixes it.
    """
    prev = {br: flow_counters(br) for br in bridges}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        cur = {br: flow_counters(br) for br in bridges}
        if cur == prev:
            return cur
        prev = cur
    return prev
