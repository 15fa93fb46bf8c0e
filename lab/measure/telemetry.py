"""Per-port counters sampled into time series, qdisc drops and backlog, CPU headroom.

Every switch egress port is one end of a veth pair in the root namespace, so the kernel's
own interface counters are exactly what crossed that emulated link, and the htb/bfifo qdisc
on it holds the configured queue's drops and backlog.

Both are read over rtnetlink from inside this process (``lab.measure.netlink``): a link
dump and a qdisc dump per sample, the same numbers ``ip -s link`` and ``tc -s qdisc`` print.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from lab.agents.common import process_cpu_ticks
from lab.machine import cpuclass, remote
from lab.measure import live, ofstats
from lab.measure.headroom import DatapathThreads, proc_stat
from lab.measure.netlink import LinkCounters, netlink


@dataclass(frozen=True)
class Port:
    """A switch egress port and the link it drives."""

    node: str
    port: int
    peer: str
    intf: str
    bw_mbps: float
    #: Which network the link is on: ``fabric``, or ``mgmt`` for the management LAN.
    role: str = "fabric"


@dataclass
class PortSnapshot:
    tx_bytes: int
    tx_packets: int
    tx_dropped: int
    qdisc_drops: int
    backlog_bytes: int
    up: bool = True


# -- rtnetlink, in-process ----------------------------------------------------------------
# pyroute2 opens the socket inside a namespace and encodes the two requests; the replies are
# walked here with ``struct`` for the few fields the lab reads. Measured on a live fabric
# (18 qdiscs, 25 links in the root namespace), CPU per dump: pyroute2's own message decoding
# 4.3 ms (2.1 ms with a minimal message class), more than a ``tc`` spawn (2.8 ms); the walk
# below 0.13 ms for qdiscs and 0.55 ms for links (sysfs: 1.6 ms for 16 ports' counters).
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")       # the unit of /proc/<pid>/stat CPU times


def by_worker(ports: list[Port]) -> dict[remote.Agent | None, list[Port]]:
    """Ports grouped by the agent of the worker they are on (None: this machine's).

    On one machine every port is this machine's; in a cluster (``lab.machine.remote``) a
    port is read where its switch runs, by the same code, and the answers merged.
    """
    return remote.by_agent(ports, lambda p: p.node)


def _port_args(ports: list[Port]) -> list[list[Any]]:
    return [[p.node, p.port, p.peer, p.intf, p.bw_mbps] for p in ports]


def _remote_snapshot(agent: remote.Agent, ports: list[Port],
                     drained: bool) -> dict[Port, PortSnapshot]:
    got = agent.request("snapshot", ports=_port_args(ports), drained=drained)["ports"]
    return {p: PortSnapshot(**got[p.intf]) for p in ports}


def snapshot(ports: list[Port]) -> dict[Port, PortSnapshot]:
    """Every port's counters and queue, from one link dump and one qdisc dump (per worker)."""
    snap: dict[Port, PortSnapshot] = {}
    for agent, mine in by_worker(ports).items():
        snap.update(_local_snapshot(mine) if agent is None
                    else _remote_snapshot(agent, mine, drained=False))
    return snap


def _local_snapshot(ports: list[Port]) -> dict[Port, PortSnapshot]:
    if not ports:
        return {}
    nl = netlink()
    links = nl.links()
    q = nl.qdiscs()
    absent = LinkCounters(0, 0, 0, False)
    snap = {}
    for p in ports:
        c = links.get(p.intf, absent)
        drops, backlog = q.get(p.intf, (0, 0))
        snap[p] = PortSnapshot(c.tx_bytes, c.tx_packets, c.tx_dropped, drops, backlog, c.up)
    return snap


class TxBytes:
    """Bytes sent by each of some interfaces of this namespace, from their sysfs counters
    (the same as ``ip -s link``), the files kept open and re-read in place.

    What the sampler reads many times a second: a link dump costs ~10x as much (every
    interface's every attribute, parsed in Python), which under TCG is most of a core.
    An interface that is gone reads as absent until it is back.
    """

    def __init__(self, intfs: list[str]) -> None:
        self._fds: dict[str, int | None] = dict.fromkeys(intfs)

    def read(self) -> dict[str, int]:
        out = {}
        for intf, fd in self._fds.items():
            try:
                if fd is None:
                    fd = self._fds[intf] = os.open(
                        f"/sys/class/net/{intf}/statistics/tx_bytes", os.O_RDONLY)
                out[intf] = int(os.pread(fd, 32, 0))
            except (OSError, ValueError):
                self._drop(intf)
        return out

    def _drop(self, intf: str) -> None:
        fd = self._fds.get(intf)
        if fd is not None:
            os.close(fd)
        self._fds[intf] = None

    def close(self) -> None:
        for intf in list(self._fds):
            self._drop(intf)


def drained_snapshot(ports: list[Port], timeout_s: float = 3.0,
                     poll_s: float = 0.05) -> dict[Port, PortSnapshot]:
    """A snapshot once every queue is empty and no port is sending any more (each
    worker's ports read where they are: :func:`local_drained_snapshot`)."""
    snap: dict[Port, PortSnapshot] = {}
    for agent, mine in by_worker(ports).items():
        snap.update(local_drained_snapshot(mine, timeout_s, poll_s) if agent is None
                    else _remote_snapshot(agent, mine, drained=True))
    return snap


def local_drained_snapshot(ports: list[Port], timeout_s: float = 3.0,
                           poll_s: float = 0.05) -> dict[Port, PortSnapshot]:
    """A snapshot once every queue is empty and no port is sending any more.

    Senders stop when their last byte is handed to the network, not when it arrives; bytes
    still queued at that moment were counted where they entered the fabric but not yet on
    the links (measured: up to a queue's worth, 120 kB, per port). Waiting for the queues
    to drain makes the link and flow counters describe the same packets.
    """
    prev = _local_snapshot(ports)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        cur = _local_snapshot(ports)
        if all(c.backlog_bytes == 0 and c.tx_bytes == prev[p].tx_bytes
               for p, c in cur.items()):
            return cur
        prev = cur
    return prev


class HasProcess(Protocol):
    """A lab helper running as its own process (the controller)."""

    proc: subprocess.Popen[bytes] | None


def lab_cpu_ticks(controller: HasProcess | None) -> dict[int, int]:
    """{pid: CPU ticks so far} of the lab's own processes: this one (every thread: the
    samplers, the fault injector, the run itself) and the controller with the helpers it
    reaps (tc/nft for ECN marking).

    This process's reaped children are not counted: they include the traffic generators
    (iperf3, workers, stream senders), which are the emulation, not the lab's overhead.
    """
    ticks = {os.getpid(): process_cpu_ticks(os.getpid()) or 0}
    proc = controller.proc if controller is not None else None
    if proc is not None:
        t = process_cpu_ticks(proc.pid, children=True)
        if t is not None:
            ticks[proc.pid] = t
    return ticks


def worst_lab_cpu_pct(phases: Iterable[float | None]) -> float | None:
    """A multi-phase run's ``fidelity.lab_cpu_pct``: its busiest phase's, as its
    ``cpu_idle_min_pct`` is its least idle phase's."""
    return max((x for x in phases if x is not None), default=None)


@dataclass
class Series:
    t: list[float] = field(default_factory=list)
    tx_bps: list[float] = field(default_factory=list)
    queue_bytes: list[int] = field(default_factory=list)


#: Samples per second of a run's counters and queues.
SAMPLE_HZ = 10.0


@dataclass(frozen=True)
class SpareWork:
    """CPU a scenario burns on purpose as modelled host work (a data loader's preprocessing),
    run at idle priority (``SCHED_IDLE``): ``cpu_s`` of it between ``t0`` and ``t1`` (the
    sampler's clock).

    At idle priority it gets only what every other task leaves, so it cannot starve the
    emulation, and the fidelity check counts it as idle: otherwise a phase whose cause *is*
    a busy CPU would always read as an emulator out of CPU, which it is not.
    """

    t0: float
    t1: float
    cpu_s: float


def spare_cpu_s(spare: Sequence[SpareWork], t_from: float, t_to: float) -> float:
    """The CPU seconds of ``spare`` work inside ``[t_from, t_to]``, each piece spread evenly
    over its own interval (a burn between two samples is not seen more finely)."""
    total = 0.0
    for w in spare:
        if w.t1 <= w.t0:
            total += w.cpu_s if t_from <= w.t0 <= t_to else 0.0
            continue
        overlap = min(w.t1, t_to) - max(w.t0, t_from)
        if overlap > 0:
            total += w.cpu_s * overlap / (w.t1 - w.t0)
    return total


class Sampler(threading.Thread):
    """Samples every port at ``hz`` into per-port series, CPU idle per second, and the CPU
    the lab's own processes use (``controller``: the run's controller, if it has one)."""

    def __init__(self, ports: list[Port], hz: float = 10.0,
                 controller: HasProcess | None = None,
                 classes: cpuclass.CpuClasses | None = None,
                 on_queues: Callable[[dict[str, int]], None] | None = None) -> None:
        super().__init__(daemon=True, name="fabriclab-sampler")
        self.ports = ports
        #: Given every sample's queue backlogs ({intf: bytes}): a policy placing by queues
        #: reacts to the same samples the run reports (``lab.measure.queuefeed``).
        self.on_queues = on_queues
        self.period = 1.0 / hz
        self.controller = controller
        #: The run's CPU classes (``lab.machine.cpuclass``), whose CPU and waiting are read
        #: once a second.
        self.classes = classes
        self.dp = DatapathThreads()
        #: (time since t0, datapath threads' credible run-queue wait ns, softirq jiffies,
        #: total jiffies, wait the kernel charged them beyond it ns) at every sample.
        self.datapath: list[tuple[float, int, int, int, int]] = []
        #: (time since t0, {class: CPU ns}, {class: (run-queue wait ns, programs)}) once a
        #: second.
        self.class_cpu: list[tuple[float, dict[str, int], dict[str, tuple[int, int]]]] = []
        self.series: dict[Port, Series] = {p: Series() for p in ports}
        #: (time since t0, idle jiffies, total jiffies) at every sample.
        self.cpu: list[tuple[float, int, int]] = []
        #: (time since t0, {pid: CPU ticks}) of the lab's own processes at every sample.
        self.lab_cpu: list[tuple[float, dict[int, int]]] = []
        self._stop_evt = threading.Event()
        self.t0 = 0.0
        groups = by_worker(ports)
        #: This machine's ports; the others are sampled by their workers' agents.
        self.local = groups.pop(None, [])
        self.remote = groups
        #: Per remote worker, its CPU samples (as ``cpu`` and ``lab_cpu``), on this clock.
        self.worker_cpu: dict[str, list[tuple[float, int, int]]] = {}
        self.worker_lab_cpu: dict[str, list[tuple[float, dict[int, int]]]] = {}

    def run(self) -> None:
        self.t0 = time.monotonic()
        for agent, mine in self.remote.items():
            agent.request("sample_start", ports=_port_args(mine), hz=1.0 / self.period)
        tx = TxBytes([p.intf for p in self.local])
        try:
            self._sample(tx)
        finally:
            tx.close()

    def _tick(self, tx: TxBytes) -> dict[Port, tuple[int, int]]:
        """{port: (tx bytes, queue backlog bytes)} now (and to the live view, if any)."""
        sent = tx.read()
        q = netlink().qdiscs()
        feed = live.current()
        if feed is not None:
            feed.publish(time.monotonic(), {(p.node, p.port): sent[p.intf]
                                            for p in self.local if p.intf in sent})
        return {p: (sent.get(p.intf, 0), q.get(p.intf, (0, 0))[1]) for p in self.local}

    def _cpu_sample(self, t: float, n: int) -> None:
        """The machine's CPU, the datapath's waiting, the lab's own CPU at sample ``n``; the
        classes' once a second (every ``1 / period`` samples: a class's threads are many)."""
        idle, total, softirq = proc_stat()
        self.cpu.append((t, idle, total))
        self.datapath.append((t, self.dp.wait_ns(), softirq, total, self.dp.asleep_ns))
        self.lab_cpu.append((t, lab_cpu_ticks(self.controller)))
        if self.classes is not None and n % max(1, round(1.0 / self.period)) == 0:
            self.class_cpu.append((t, self.classes.usage_ns(), self.classes.waiting()))

    def _sample(self, tx: TxBytes) -> None:
        prev = self._tick(tx)
        prev_t = self.t0
        self._cpu_sample(0.0, 0)
        n = 0
        next_t = self.t0 + self.period
        while not self._stop_evt.is_set():
            delay = next_t - time.monotonic()
            if delay > 0 and self._stop_evt.wait(delay):
                break
            next_t += self.period
            now = time.monotonic()
            cur = self._tick(tx)
            dt = max(now - prev_t, 1e-6)
            for p in self.local:
                s = self.series[p]
                s.t.append(round(now - self.t0, 4))
                s.tx_bps.append((cur[p][0] - prev[p][0]) * 8 / dt)
                s.queue_bytes.append(cur[p][1])
            if self.on_queues is not None:
                self.on_queues({p.intf: cur[p][1] for p in self.local})
            prev, prev_t = cur, now
            n += 1
            self._cpu_sample(now - self.t0, n)

    def cpu_idle_pct(self, t_from: float, t_to: float, window_s: float = 1.0,
                     cpu: list[tuple[float, int, int]] | None = None,
                     spare: Sequence[SpareWork] = ()) -> list[float]:
        """Idle CPU (all cores) in consecutive ``window_s`` windows between two sample times
        (of this machine, or of the samples ``cpu`` of another worker).

        Windows start at ``t_from`` (the traffic phase), so the lab's own set-up before it
        does not count against the emulation; a final partial window shorter than half a
        window is dropped as too noisy. ``spare``: work the scenario burns on purpose at idle
        priority, counted as idle (see :class:`SpareWork`).
        """
        out = []
        for a, b in self._seconds(self.cpu if cpu is None else cpu, t_from, t_to, window_s):
            total = b[2] - a[2]
            if total > 0:
                given = spare_cpu_s(spare, a[0], b[0]) * CLOCK_TICKS
                out.append(min(100.0, 100.0 * (b[1] - a[1] + given) / total))
        return out

    def _seconds(self, samples: Sequence[tuple[Any, ...]], t_from: float, t_to: float,
                 window_s: float = 1.0) -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        """(first, last) samples of consecutive ``window_s`` windows between two sample
        times: the one cut of a phase into seconds that every per-second number uses. A
        final window shorter than half a window is dropped as too noisy."""
        pts = [c for c in samples if t_from - self.period <= c[0] <= t_to + self.period]
        out = []
        i = 0
        while i < len(pts) - 1:
            j = i
            while j < len(pts) - 1 and pts[j][0] - pts[i][0] < window_s:
                j += 1
            if pts[j][0] - pts[i][0] >= window_s / 2:
                out.append((pts[i], pts[j]))
            i = j
        return out

    def datapath_numbers(self, t_from: float, t_to: float) -> dict[str, Any]:
        """The datapath's waiting per second of the window: its threads' run-queue wait in
        ms per second (summed over threads: 100 means a tenth of a second of forwarding was
        ready and had no CPU), and the share of all CPU time spent in softirq; each with its
        worst second. Then each CPU class's CPU and waiting over the window, in % of one
        core."""
        wait, soft = [], []
        seconds = self._seconds(self.datapath, t_from, t_to)
        for a, b in seconds:
            span = max(b[0] - a[0], 1e-6)
            wait.append(round((b[1] - a[1]) / 1e6 / span, 1))
            soft.append(round(100.0 * (b[2] - a[2]) / max(b[3] - a[3], 1), 1))
        if self.dp.vswitchd is None:        # no datapath seen: its waiting is unknown
            wait = []
        asleep = (seconds[-1][1][4] - seconds[0][0][4]) / 1e6 if seconds and wait else 0.0
        out: dict[str, Any] = {
            "datapath_wait_ms": wait, "datapath_wait_max_ms": max(wait, default=0.0),
            "datapath_wait_asleep_ms": round(asleep, 1),
            "softirq_pct": soft, "softirq_max_pct": max(soft, default=0.0)}
        pts = [c for c in self.class_cpu if t_from - 1.0 <= c[0] <= t_to + 1.0]
        if self.classes is not None and len(pts) >= 2:
            span = max(pts[-1][0] - pts[0][0], 1e-6)
            classes = {}
            for cls in pts[-1][1]:
                used = pts[-1][1][cls] - pts[0][1].get(cls, 0)
                waited = sum(max(0, b[2].get(cls, (0, 0))[0] - a[2].get(cls, (0, 0))[0])
                             for a, b in itertools.pairwise(pts))
                programs = max(p[2].get(cls, (0, 0))[1] for p in pts)
                classes[cls] = {"cpu_pct": round(100.0 * used / 1e9 / span, 1),
                                "wait_pct": round(100.0 * waited / 1e9 / span, 1),
                                "programs": programs}
            out["cpu_classes"] = classes
        return out

    def judge(self, t_counters: float, t_from: float, t_to: float,
              spare: Sequence[SpareWork] = ()) -> dict[str, Any]:
        """The fidelity numbers of the traffic between two sample times: idle CPU per second,
        its least, the lab's own CPU, and the window in seconds from ``t_counters`` (when the
        phase's counters were read), so a result says which seconds it judged. With
        ``spare`` work, ``spare_work`` says how much CPU it took and the least idle second
        without counting it as idle."""
        idle = [round(x, 1) for x in self.cpu_idle_pct(t_from, t_to, spare=spare)]
        judged = {"cpu_idle_pct": idle, "cpu_idle_min_pct": min(idle, default=100.0),
                  "lab_cpu_pct": self.lab_cpu_pct(t_from, t_to),
                  "window_s": [round(t_from - t_counters, 3), round(t_to - t_counters, 3)],
                  **self.datapath_numbers(t_from, t_to)}
        if spare:
            raw = self.cpu_idle_pct(t_from, t_to)
            judged["spare_work"] = {
                "cpu_s": round(spare_cpu_s(spare, t_from - self.period, t_to + self.period),
                               3),
                "cpu_idle_min_pct_without": round(min(raw, default=100.0), 1)}
        placement = remote.current()
        if placement is not None:
            # Valid only if every worker had CPU to spare: the least idle second of all.
            workers = {placement.head: {"cpu_idle_min_pct": judged["cpu_idle_min_pct"],
                                        "lab_cpu_pct": judged["lab_cpu_pct"]}}
            for name, cpu in self.worker_cpu.items():
                theirs = [round(x, 1) for x in self.cpu_idle_pct(t_from, t_to, cpu=cpu)]
                workers[name] = {"cpu_idle_min_pct": min(theirs, default=100.0),
                                 "lab_cpu_pct": self.lab_cpu_pct(
                                     t_from, t_to, self.worker_lab_cpu.get(name))}
            for name, w in workers.items():
                placement.judged(name, w["cpu_idle_min_pct"], w["lab_cpu_pct"])
            judged["workers"] = workers
            judged["cpu_idle_min_pct"] = min(w["cpu_idle_min_pct"] for w in workers.values())
        return judged

    def lab_cpu_pct(self, t_from: float, t_to: float,
                    samples: list[tuple[float, dict[int, int]]] | None = None) -> float | None:
        """CPU the lab's own processes used between two sample times, in % of one core
        (up to 100 x cores), so a CPU-bound run shows how much of it was the lab's doing.

        Summed sample to sample per process: a controller restarted mid-phase counts from
        its start; the last moments of one that died are not seen. None without two samples.
        """
        pts = [c for c in (self.lab_cpu if samples is None else samples)
               if t_from - self.period <= c[0] <= t_to + self.period]
        if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
            return None
        ticks = 0
        for (_, a), (_, b) in itertools.pairwise(pts):
            ticks += sum(max(0, t - a.get(pid, 0)) for pid, t in b.items())
        return round(100.0 * ticks / CLOCK_TICKS / (pts[-1][0] - pts[0][0]), 1)

    def stop(self) -> None:
        self._stop_evt.set()
        if self.ident is None:          # never started (the run failed before its traffic)
            return
        self.join(timeout=5)
        placement = remote.current()
        for agent, mine in self.remote.items():
            self._merge(agent, mine, placement.offsets[agent.name].offset_s
                        if placement and agent.name in placement.offsets else 0.0)
        self.remote = {}

    def _merge(self, agent: remote.Agent, ports: list[Port], offset_s: float) -> None:
        """A worker's series and CPU samples, moved onto this machine's clock: a worker's
        time t (from its sampler's start) is ``t0 + t - offset`` here."""
        got = agent.request("sample_stop")
        if not got:
            return
        shift = float(got["t0"]) - offset_s - self.t0
        for p in ports:
            ser = got["series"][p.intf]
            self.series[p] = Series([round(t + shift, 4) for t in ser["t"]], ser["tx_bps"],
                                    ser["queue_bytes"])
        self.worker_cpu[agent.name] = [(t + shift, i, a) for t, i, a in got["cpu"]]
        self.worker_lab_cpu[agent.name] = [(t + shift, {int(k): v for k, v in d.items()})
                                           for t, d in got["lab_cpu"]]


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


def mgmt_ports(topo_desc: dict) -> list[Port]:
    """Every switch egress port of the management network (role ``mgmt``), none without one.

    Kept out of :func:`fabric_ports`: what reads those (link tables, paths, plots) means the
    fabric. Whoever asks which network carried some traffic counts both lists.
    """
    mgmt = topo_desc.get("mgmt") or {}
    switches = {s["name"] for s in mgmt.get("switches", [])}
    ports = []
    for link in mgmt.get("links", []):
        for node, port, peer in ((link["a"], link["a_port"], link["b"]),
                                 (link["b"], link["b_port"], link["a"])):
            if node in switches:
                ports.append(Port(node, port, peer, f"{node}-eth{port}", link["bw_mbps"],
                                  role=str(link.get("role", "mgmt"))))
    return sorted(ports, key=lambda p: (p.node, p.port))


def flow_counters(bridges: list[str]) -> dict[str, dict[int, tuple[int, int]]]:
    """{bridge: {cookie: (packets, bytes)}} of the per-flow counter entries in table 0 of
    every bridge, read now (each worker's bridges where they run).

    These are the switch's own counters for exactly the packets that matched the flow's
    5-tuple there. All of a machine's bridges are asked at once (``ofstats``): one
    ``ovs-ofctl`` per bridge kept ``ovs-vswitchd`` busy for a core at k=8.
    """
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for agent, mine in remote.by_agent(bridges, str).items():
        out.update(ofstats.table0_counters(mine) if agent is None
                   else _remote_flows(agent, mine, settled=False))
    return out


def _remote_flows(agent: remote.Agent, bridges: list[str],
                  settled: bool) -> dict[str, dict[int, tuple[int, int]]]:
    got = agent.request("flows", bridges=bridges, settled=settled)["flows"]
    return {br: {int(c): (int(v[0]), int(v[1])) for c, v in got[br].items()} for br in bridges}


def settled_flow_counters(bridges: list[str], quiet_s: float = 0.6,
                          timeout_s: float = 4.0) -> dict[str, dict[int, tuple[int, int]]]:
    """Per-flow counters of every bridge once they stop moving.

    OVS attributes datapath traffic to OpenFlow rules in revalidator rounds (about every
    500 ms), so a read right after traffic stops misses the last few hundred milliseconds -
    measured: 3-4 % of a 4 s flow. Reading until two reads ``quiet_s`` apart agree fixes it.
    In a cluster each worker settles its own bridges.
    """
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for agent, mine in remote.by_agent(bridges, str).items():
        out.update(_local_settled(mine, quiet_s, timeout_s) if agent is None
                   else _remote_flows(agent, mine, settled=True))
    return out


def _local_settled(bridges: list[str], quiet_s: float,
                   timeout_s: float) -> dict[str, dict[int, tuple[int, int]]]:
    prev = ofstats.table0_counters(bridges)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        cur = ofstats.table0_counters(bridges)
        if cur == prev:
            return cur
        prev = cur
    return prev
