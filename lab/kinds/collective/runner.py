"""Run a collective job's phases on one fabric: placement, paths, marking, traffic, counters.

One fabric for every phase (bring-up is the slow part and the comparison is fairer on the
same switches); each phase starts its own workers, so placement may change between phases.
Per phase, in this order: place the ranks; plan every connection's 5-tuple; ask the
controller to pin (or unpin) paths and to set ECN marking; watch every connection on every
switch; start storage, sampling and capture; run the job to its last step; read every
counter once the queues have drained; stop what the phase started.
"""

from __future__ import annotations

import copy
import itertools
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controllers.marking import dctcp_k_bytes
from lab.kinds.base import Plan, Progress
from lab.kinds.collective import gloo
from lab.kinds.collective import jobplan as kind
from lab.kinds.collective import metrics as jm
from lab.kinds.collective.jobplan import Conn
from lab.kinds.collective.programs import JobPrograms, load, wait
from lab.machine import programs
from lab.measure import ecnwire, telemetry
from lab.measure.result import flow_entries
from lab.measure.window import Window
from lab.model.errors import MachineError
from lab.model.flowpaths import attachment
from lab.model.flows import FlowSpec

if TYPE_CHECKING:
    from lab.net.fabric import Fabric

#: Source ports come from below the kernel's ephemeral range, so a fixed ``bind`` never
#: races a port the kernel handed to another socket.
SPORT_RANGE = range(20000, 32000)
TCP_COUNTERS = {"TcpExt": ("TCPTimeouts", "TCPLossProbes", "TCPFastRetrans"),
                "Tcp": ("RetransSegs", "OutSegs")}
#: Congestion controls whose receiver has a part to play: a DCTCP receiver echoes CE per
#: packet (RFC 8257, section 3.2) instead of RFC 3168's "ECE until CWR". Accepted sockets
#: take their namespace's default, so the job's hosts default to it for the phase (which
#: the kernel allows in a namespace only for a congestion control on its allowed list).
RECEIVER_CC = ("dctcp",)
#: Pings per sender when the base RTT is measured for DCTCP's K: the smallest of these is
#: the RTT without queueing.
RTT_PINGS = 10


def read_proc(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def parse_ping_min_ms(text: str) -> float | None:
    """The minimum RTT (ms) from ping's summary line (``rtt min/avg/max/mdev = a/b/c/d ms``),
    or None when no reply came back."""
    for line in text.splitlines():
        head, sep, values = line.partition(" = ")
        if sep and head.strip().endswith("min/avg/max/mdev"):
            try:
                return float(values.split("/")[0])
            except ValueError:
                return None
    return None


def tcp_counters(pid: int) -> dict[str, int]:
    """A namespace's own TCP counters (per-netns in /proc/PID/net), e.g. RTO timeouts."""
    out: dict[str, int] = {}
    for name in ("netstat", "snmp"):
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()
        except OSError:
            continue
        for head, vals in zip(lines[::2], lines[1::2], strict=False):
            section, _, keys = head.partition(": ")
            wanted = TCP_COUNTERS.get(section, ())
            for k, v in zip(keys.split(), vals.partition(": ")[2].split(), strict=False):
                if k in wanted:
                    out[k] = int(v)
    return out


def _sum_delta(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
               ) -> dict[str, int]:
    total: dict[str, int] = {}
    for host, vals in after.items():
        for k, v in vals.items():
            total[k] = total.get(k, 0) + v - before.get(host, {}).get(k, 0)
    return total


@dataclass
class Phase:
    """A phase's settings on the fabric: placed workers, planned connections, paths pinned,
    the marking and the DCTCP K rule it was given."""

    pp: dict[str, Any]
    work: Path
    hosts: list[str]
    conns: list[Conn]
    sconns: list[Conn]
    pinned: list[dict[str, Any]]
    marking: dict[str, Any] | None
    k_rule: dict[str, Any] | None


@dataclass
class Drive:
    """What the job's run left to read: its window, when the job ended, ECN and TCP counters
    at both ends, the receiver's capture and the micro-bursts (incast)."""

    window: Window
    t_job_end: float = 0.0
    ecn0: dict[str, dict[str, int]] = field(default_factory=dict)
    ecn1: dict[str, dict[str, int]] = field(default_factory=dict)
    tcp0: dict[str, dict[str, int]] = field(default_factory=dict)
    tcp1: dict[str, dict[str, int]] = field(default_factory=dict)
    capture: Any = None
    bursts: dict[str, Any] | None = None


class JobRun(JobPrograms):
    """The running fabric plus what the job's phases need to know about it."""

    def __init__(self, plan_: Plan, fabric: Fabric, progress: Progress) -> None:
        self.plan = plan_
        self.fabric = fabric
        self.progress = progress
        self.topo = plan_.topo_desc
        self.rng = random.Random(int(plan_.params["seed"]))
        self.sports = self.rng.sample(SPORT_RANGE, 2000)
        self.ips = {h["name"]: h["ip"] for h in self.topo["hosts"]}
        self.macs = {h["name"]: h["mac"] for h in self.topo["hosts"]}
        self.leaf_of = attachment(self.topo)
        self.ports = telemetry.fabric_ports(self.topo)
        self.bw = {}
        for ln in self.topo["links"]:
            self.bw[(ln["a"], ln["b"])] = self.bw[(ln["b"], ln["a"])] = ln["bw_mbps"] * 1e6
        self.next_index = 0
        self.marked: set[str] = set()
        #: Hosts whose namespace default congestion control a phase changed: what it was.
        self.default_cc: dict[str, str] = {}
        self.work = fabric.run_dir / "job"
        for h in self.topo["hosts"]:
            # A GPU job's connections idle between steps; Linux would slow-start each step's
            # first chunk again (RDMA transports do not): an artefact of TCP, not the fabric.
            self.host(h["name"]).cmd("sysctl -qw net.ipv4.tcp_slow_start_after_idle=0")

    def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.fabric.controller is not None
        return self.fabric.controller.request(msg)

    # -- planning -----------------------------------------------------------------------------
    def conns_for(self, pp: dict[str, Any], hosts: list[str]) -> list[Conn]:
        job = pp["job"]
        if job["library"] == "gloo":
            return []                   # gloo numbers its own: found after rendezvous
        if job["pattern"] == "ring":
            conns = kind.ring_conns(hosts, self.ips, job, self.sports, self.next_index)
        else:
            rx = self.receiver(pp, hosts)
            conns = []
            for i, h in enumerate(x for x in hosts if x != rx):
                spec = FlowSpec(id=f"s{i + 1}", src=h, dst=rx, src_ip=self.ips[h],
                                dst_ip=self.ips[rx], proto="tcp", sport=self.sports.pop(),
                                dport=kind.SINK_PORT, rate_bps=0.0, kind="incast",
                                cc=job["cc"])
                conns.append(Conn(spec, i + 1, 0, self.next_index + i))
        self.next_index += len(conns)
        return conns

    def storage_conns(self, pp: dict[str, Any], hosts: list[str]) -> list[Conn]:
        st = pp["storage"]
        if st["mode"] == "off":
            return []
        conns = []
        for r, h in enumerate(hosts):
            srv = st["hosts"][r % len(st["hosts"])]
            for what in ("read", "checkpoint"):
                src, dst = (srv, h) if what == "read" else (h, srv)
                sport = self.sports.pop()
                # A read flows from the server; its 5-tuple is the client's connection seen
                # from the server's side.
                spec = FlowSpec(id=f"{what}{r}", src=src, dst=dst, src_ip=self.ips[src],
                                dst_ip=self.ips[dst], proto="tcp",
                                sport=kind.STORAGE_PORT if what == "read" else sport,
                                dport=sport if what == "read" else kind.STORAGE_PORT,
                                rate_bps=st["read_mbps"] * 1e6 if what == "read" else 0.0,
                                kind=f"storage-{what}", cc=pp["job"]["cc"])
                conns.append(Conn(spec, r, 0, self.next_index))
                self.next_index += 1
        return conns

    @staticmethod
    def receiver(pp: dict[str, Any], hosts: list[str]) -> str:
        return pp["placement"]["receiver"] or hosts[0]

    def bottleneck_bps(self, flows: list[dict[str, Any]]) -> float:
        """The slowest configured link any of the job's connections crossed."""
        rates = []
        for f in flows:
            hops = [f["src"], *f["path"], f["dst"]]
            rates += [self.bw[(a, b)] for a, b in itertools.pairwise(hops)
                      if (a, b) in self.bw]
        return min(rates, default=0.0)

    # -- controller: paths and marking ----------------------------------------------------------
    def set_paths(self, pp: dict[str, Any], conns: list[Conn]) -> list[dict[str, Any]]:
        """Pin the job's connections (``balanced``) or hand them back to the policy."""
        pins: list[dict[str, Any]] = []
        if pp["placement"]["paths"] == "balanced":
            up = kind.uplink_ports(self.topo)
            pins = kind.balanced_pins([c for c in conns if c.spec.kind == "allreduce"],
                                      self.leaf_of, up)
        self.request({"cmd": "pin", "flows": pins})
        return pins

    def set_marking(self, pp: dict[str, Any], where: str) -> dict[str, Any] | None:
        body = kind.check_marking(pp["ecn"], where)
        ports = set(pp["ecn"]["ports"]) if body else set()
        todo = [{"intf": p, **body} for p in sorted(ports)] if body else []
        todo += [{"intf": p, "off": True} for p in sorted(self.marked - ports)]
        if todo:
            self.request({"cmd": "ecn", "ports": todo})
        self.marked = ports
        return body

    def dctcp_k(self, pp: dict[str, Any], conns: list[Conn]
                ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The phase's parameters with ``ecn.k_bytes`` set by DCTCP's rule, and why.

        C is the slowest marked port's configured rate; RTT is measured on the running
        fabric (the emulator's own delay and any configured propagation delay alike): the
        smallest of RTT_PINGS pings from each connection's sender to its receiver, the
        largest of those over the connections (K must hold for the longest path).
        """
        rates = {p.intf: p.bw_mbps * 1e6 for p in self.ports}
        rate = min(rates[i] for i in pp["ecn"]["ports"])
        rtts = self.base_rtt_ms(conns)
        if not rtts or any(v is None for v in rtts.values()):
            lost = sorted(k for k, v in rtts.items() if v is None)
            raise MachineError("ecn.k_rule", f"no ping reply on {', '.join(lost)}: the base "
                               "RTT for DCTCP's K cannot be measured")
        worst = max(rtts, key=lambda k: rtts[k] or 0.0)
        k, why = dctcp_k_bytes(rate, (rtts[worst] or 0.0) / 1000)
        why.update({"rtt_from": f"ping min of {RTT_PINGS}, largest over the job's "
                                f"connections ({worst})",
                    "rtt_ms_by_path": rtts, "rate_from": "slowest marked port"})
        limit = min(p["queue_bytes"] for p in self.topo["links"]
                    if any(f"{n}-eth{pt}" in pp["ecn"]["ports"]
                           for n, pt in ((p["a"], p["a_port"]), (p["b"], p["b_port"]))))
        if k >= limit:
            why["note"] = (f"K {k} B is not below the port's queue ({limit} B): the queue "
                           "drops before it marks")
        out = copy.deepcopy(pp)
        out["ecn"]["k_bytes"] = k
        return out, why

    def base_rtt_ms(self, conns: list[Conn]) -> dict[str, float | None]:
        """{"src->dst": min ping RTT in ms (None: no reply)} over the connections, the
        pings of all senders at once (each from its own namespace)."""
        pairs = sorted({(c.spec.src, c.spec.dst, c.spec.dst_ip) for c in conns})
        procs = [(f"{s}->{d}", self.host(s).popen(
            ["ping", "-n", "-q", "-c", str(RTT_PINGS), "-i", "0.05", "-W", "2", ip],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            for s, d, ip in pairs]
        out: dict[str, float | None] = {}
        for name, proc in procs:
            try:
                text, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                text, _ = proc.communicate()
            out[name] = parse_ping_min_ms(text or "")
        return out

    def set_default_cc(self, pp: dict[str, Any], hosts: list[str]) -> None:
        """The job's hosts' namespace default congestion control, for the sockets they
        accept: the job's when its receiver has a part (RECEIVER_CC) or gloo opens them,
        else as it was."""
        cc = pp["job"]["cc"]
        # gloo's sockets are not the lab's to set a congestion control on: they take their
        # namespace's default, so the job's hosts default to the job's for the phase.
        wanted = set(hosts) if cc in RECEIVER_CC or pp["job"]["library"] == "gloo" else set()
        for h in sorted(wanted | set(self.default_cc)):
            node = self.host(h)
            if h in wanted:
                if h not in self.default_cc:
                    self.default_cc[h] = node.cmd(
                        "sysctl -n net.ipv4.tcp_congestion_control").strip()
                want = cc
            else:
                want = self.default_cc.pop(h)
            out = node.cmd(f"sysctl -qw net.ipv4.tcp_congestion_control={want} 2>&1; "
                           "echo __rc=$?")
            text, _, rc = out.rpartition("__rc=")
            if rc.strip() != "0":
                raise MachineError("job.cc", f"{h}: cannot make {want} its namespace's "
                                   f"default: {text.strip()}")

    def ecn_counters(self) -> dict[str, dict[str, int]]:
        if not self.marked and self.plan.env.ecn == "none":
            return {}
        return self.request({"cmd": "ecn_stats"}).get("ports", {})

    # -- storage --------------------------------------------------------------------------------
    def run_phase(self, name: str, pp: dict[str, Any]) -> dict[str, Any]:
        """One phase: its network settings, the job (and storage) on the fabric inside one
        measurement window, then its links, flows and metrics."""
        ph = self.configure(name, pp)
        if ph.pp["storage"]["mode"] == "classes":
            self.storage_classes(ph.pp, ph.hosts, on=True)
        try:
            drive = self.drive(name, ph)
        finally:
            if ph.pp["storage"]["mode"] == "classes":
                self.storage_classes(ph.pp, ph.hosts, on=False)
        return self.phase_result(ph, drive)

    def configure(self, name: str, pp: dict[str, Any]) -> Phase:
        """Place the workers, plan their connections, and set the phase's paths, marking,
        congestion control and ECN on the hosts; the switches count every connection."""
        work = self.work / name
        work.mkdir(parents=True, exist_ok=True)
        where = "ecn" if name == "run" else f"phases.{name}.ecn"
        hosts = kind.place_workers(self.topo, pp, self.rng)
        conns = self.conns_for(pp, hosts)
        sconns = self.storage_conns(pp, hosts)
        pinned = self.set_paths(pp, conns)
        k_rule = None
        if pp["ecn"]["k_rule"] == "dctcp" and pp["ecn"]["marking"] == "step":
            pp, k_rule = self.dctcp_k(pp, conns)
        marking = self.set_marking(pp, where)
        self.set_default_cc(pp, hosts)
        ecn_flag = 1 if pp["job"]["ecn"] else 0
        for h in {*hosts, *pp["storage"]["hosts"]}:
            self.host(h).cmd(f"sysctl -qw net.ipv4.tcp_ecn={ecn_flag}")
        watch = [e for c in conns + sconns for e in c.spec.watch_entries(c.index)]
        self.request({"cmd": "watch", "flows": watch})
        return Phase(pp, work, hosts, conns, sconns, pinned, marking, k_rule)

    def drive(self, name: str, ph: Phase) -> Drive:
        """The job's programs (and storage's) from start to exit, inside one window."""
        pp, job, work = ph.pp, ph.pp["job"], ph.work
        sizes = job["sizes"] or [job["size_bytes"]]
        slowest = min(self.bw.values())
        # every step's compute, plus its bytes at a quarter of the slowest link's rate
        estimate = job["steps"] * sum(job["compute_s"] + job["straggler_s"] + 2.0
                                      + 4 * 2 * size * 8 / slowest for size in sizes) + 20
        bridges = [s["name"] for s in self.topo["switches"]]
        sampler = telemetry.Sampler(self.ports, hz=float(pp["sample_hz"]),
                                    controller=self.fabric.controller)
        d = Drive(Window(sampler, self.ports, bridges, name=name))
        watched_hosts = sorted({*ph.hosts, *pp["storage"]["hosts"]})
        procs: list[subprocess.Popen] = []
        gloo_ready: list[Path] = []
        gloo_ranks: list[subprocess.Popen] = []
        try:
            sampler.start()
            if job["library"] == "gloo":
                # Before the window: torch's import and the rendezvous are set-up, and the
                # window's counters must include gloo's connections from their first byte.
                gloo_ranks, gloo_ready, reports = self.start_gloo(pp, ph.hosts, work)
                procs += gloo_ranks
                self.gloo_connections(ph, gloo_ready, gloo_ranks, reports)
            time.sleep(0.05)
            d.window.open()
            d.ecn0 = self.ecn_counters()
            d.tcp0 = {h: tcp_counters(self.host(h).pid) for h in watched_hosts}
            clients: list[subprocess.Popen] = []
            storage_ready: list[Path] = []
            if ph.sconns:
                servers, clients, storage_ready = self.start_storage(pp, ph.sconns, work,
                                                                     estimate)
                procs += servers + clients
            if job["pattern"] == "incast":
                rx = ph.conns[0].spec.dst
                d.capture = ecnwire.start_capture(self.host(rx).popen,
                                                  self.host(rx).defaultIntf().name,
                                                  work / "receiver.pcap")
                self.fabric.record.add_pid(d.capture.pid, "tcpdump at the incast receiver")
                workers = self.start_incast(pp, ph.conns, work)
            elif gloo_ranks:
                workers = gloo_ranks
            else:
                workers = self.start_ring(pp, ph.hosts, ph.conns, work)
            if storage_ready or gloo_ready:   # every GPU's checkpoints together, with the job
                programs.go(storage_ready + gloo_ready, clients + gloo_ranks)
            procs += [p for p in workers if p not in procs]
            what = (f"{len(job['sizes'])} sizes {job['sizes'][0] / 1e6:g}-"
                    f"{job['sizes'][-1] / 1e6:g} MB" if job["sizes"]
                    else f"{job['size_bytes'] / 1e6:g} MB")
            self.progress(f"[{name}] {len(ph.hosts)} workers on {', '.join(ph.hosts)}: "
                          f"{job['steps']} steps of {job['library']} {job['pattern']} {what}"
                          + (f", {len(ph.pinned)} paths placed" if ph.pinned else "")
                          + (f", ECN marking {ph.marking}" if ph.marking else ""))
            deadline = time.monotonic() + estimate
            for p in workers:
                wait(p, max(1.0, deadline - time.monotonic()))
            d.t_job_end = time.monotonic() - sampler.t0
            if job["pattern"] == "incast" and pp["microburst"]["senders"]:
                d.bursts = self.microbursts(pp, ph.hosts, ph.conns[0].spec.dst, work)
            for p in procs:                      # storage: stop it with the job
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                wait(p, 5)
            if d.capture is not None:
                d.capture.stop()
            d.window.close()
            d.ecn1 = self.ecn_counters()
            d.tcp1 = {h: tcp_counters(self.host(h).pid) for h in watched_hosts}
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            if d.capture is not None and d.capture.proc.poll() is None:
                d.capture.proc.kill()
            sampler.stop()
        return d

    def gloo_connections(self, ph: Phase, ready: list[Path], ranks: list[subprocess.Popen],
                         reports: list[Path]) -> None:
        """Once every rank has rendezvoused: gloo's connections become the phase's job
        connections, placed (a ``balanced`` phase) and watched on every switch, before the
        go and before the window opens."""
        dead, waiting = programs.wait_ready(ready, ranks, stop_at_death=True)
        if dead or waiting:
            logs = ", ".join(Path(f).with_suffix(".log").name for f in dead + waiting)
            raise MachineError("job.library", f"gloo ranks did not rendezvous "
                               f"({len(dead)} exited, {len(waiting)} hung; see {logs})")
        conns = gloo.conns_from_reports([load(r) for r in reports], ph.hosts, self.ips,
                                        ph.pp["job"]["cc"], self.next_index)
        if not any(c.spec.kind == "allreduce" for c in conns):
            raise MachineError("job.library", "gloo's connections were not found after "
                               "rendezvous (rank reports: " + ", ".join(map(str, reports)) + ")")
        self.next_index += len(conns)
        ph.conns = conns
        ph.pinned = self.set_paths(ph.pp, conns)
        self.request({"cmd": "watch", "flows": [e for c in conns
                                                for e in c.spec.watch_entries(c.index)]})

    def phase_result(self, ph: Phase, d: Drive) -> dict[str, Any]:
        """The phase's links, flows (paths from the switches' counters) and metrics."""
        pp, window, work = ph.pp, d.window, ph.work
        all_conns = ph.conns + ph.sconns
        outputs = self.read_outputs(pp, ph.hosts, ph.conns, work)
        self.attach_results(ph.conns, outputs)
        flows = flow_entries([c.spec for c in all_conns], window.flow_deltas(), self.topo,
                             [c.index for c in all_conns])
        for f, c in zip(flows, all_conns, strict=True):
            f["epoch"], f["rank"] = c.epoch, c.rank
        links = window.links()
        for ln in links:
            c0, c1 = d.ecn0.get(ln["intf"], {}), d.ecn1.get(ln["intf"], {})
            ln["ce_marked"] = c1.get("ce_marked", 0) - c0.get("ce_marked", 0)
            ln["ecn_marking"] = ph.marking if ln["intf"] in self.marked else None
        judged = window.judge(*self.fidelity_window(outputs, d))
        metrics = self.phase_metrics(pp, ph.hosts, outputs, flows, links, work)
        metrics["retransmits"] = sum(f["retransmits"] for f in flows
                                     if f["kind"] in ("allreduce", "incast"))
        metrics["tcp"] = _sum_delta(d.tcp0, d.tcp1)
        metrics["ce_marked"] = sum(ln["ce_marked"] for ln in links)
        metrics["marking"] = {"mechanism": self.plan.env.ecn, "config": ph.marking,
                              "ports": sorted(self.marked)}
        if ph.k_rule is not None:
            metrics["marking"]["k_rule"] = ph.k_rule
        metrics["library"] = pp["job"]["library"]
        metrics["program"] = pp["job"]["program"]
        if pp["job"]["library"] == "gloo":
            metrics["gloo"] = self.gloo_summary(ph, outputs, flows)
        metrics["cc"] = pp["job"]["cc"]
        metrics["paths"] = pp["placement"]["paths"]
        by_tuple = {(f["src_ip"], f["sport"], f["dst_ip"], f["dport"]): f["id"] for f in flows}
        metrics["pins"] = [{"flow": by_tuple.get((p["src"], p["sport"], p["dst"], p["dport"])),
                            "switch": p["switch"], "port": p["port"]} for p in ph.pinned]
        metrics["placement"] = pp["placement"]["hosts"]
        metrics["hosts"] = ph.hosts
        metrics["cpu_idle_min_pct"] = judged["cpu_idle_min_pct"]
        metrics["lab_cpu_pct"] = judged["lab_cpu_pct"]
        metrics["fidelity_window_s"] = judged["window_s"]
        metrics["fidelity_valid"] = (metrics["cpu_idle_min_pct"] >= telemetry.MIN_CPU_IDLE_PCT
                                     and not any(o.get("error") for o in outputs))
        if d.capture is not None:
            metrics["wire"] = ecnwire.summarize(work / "receiver.pcap",
                                                [_flow_id(f) for f in flows])
            (work / "receiver.pcap").unlink(missing_ok=True)   # captures are not kept
        if d.bursts is not None:
            metrics["microburst"] = d.bursts
        return {"duration_s": round(window.measured_s, 3), "links": links, "flows": flows,
                "metrics": metrics, "cpu_idle_pct": judged["cpu_idle_pct"],
                "outputs": outputs}

    @staticmethod
    def gloo_summary(ph: Phase, outputs: list[dict[str, Any]],
                     flows: list[dict[str, Any]]) -> dict[str, Any]:
        """What gloo was and did: torch's version, the algorithm it runs for an all_reduce
        and the one its bytes show, its connections per rank pair."""
        n = len(ph.hosts)
        per_epoch: dict[int, int] = {}
        for st in (outputs[0].get("steps") or []) if outputs else []:
            per_epoch[int(st["epoch"])] = per_epoch.get(int(st["epoch"]), 0) + 1
        return {"torch": next((o.get("torch") for o in outputs if o.get("torch")), None),
                "algorithm": next((o.get("algorithm") for o in outputs
                                   if o.get("algorithm")), None),
                "seen": gloo.algorithm_seen(flows, n, ph.pp["job"]["size_bytes"], per_epoch),
                "connections_per_pair": gloo.connections_per_pair(ph.conns, n)}

    @staticmethod
    def fidelity_window(outputs: list[dict[str, Any]], d: Drive) -> tuple[float, float]:
        """The job's steps: from when its last worker passed the start barrier to its last
        step's end, on the sampler's clock.

        Starting a dozen Python programs on two cores, and their exit, are the lab's set-up
        and teardown, not emulation; under TCG either takes seconds of both vCPUs.
        """
        t0 = d.window.sampler.t0
        t_ready = [o["t_ready"] - t0 for o in outputs if o.get("t_ready") is not None]
        t_fid = min(max([d.window.t_start, *t_ready]), d.t_job_end)
        ends = [st["t_end"] - t0 for o in outputs for st in o.get("steps") or []
                if isinstance(st, dict) and st.get("t_end") is not None]
        t_fid_end = min(max([t_fid, *ends]), d.t_job_end) if ends else d.t_job_end
        return t_fid, t_fid_end

    def read_outputs(self, pp: dict[str, Any], hosts: list[str], conns: list[Conn],
                     work: Path) -> list[dict[str, Any]]:
        if pp["job"]["pattern"] == "ring":
            return [load(work / f"rank{r}.json") for r in range(len(hosts))]
        return [load(work / "sink.json")] + [load(work / f"{c.spec.id}.json") for c in conns]

    def attach_results(self, conns: list[Conn], outputs: list[dict[str, Any]]) -> None:
        """Each connection's TCP_INFO (as its sender saw it) onto its flow."""
        info = {}
        for out in outputs:
            for c in out.get("connections", []):
                info[(c.get("sport"), c.get("dport"), c.get("src"))] = c
        for c in conns:
            got = info.get((c.spec.sport, c.spec.dport, c.spec.src_ip), {})
            span = (got.get("t_close") or 0) - (got.get("t_open") or 0)
            c.spec.result = {"retransmits": got.get("retransmits", 0),
                             "sent_bytes": got.get("bytes_acked", 0),
                             # over the connection's life: compute gaps included
                             "goodput_bps": got.get("bytes_acked", 0) * 8 / span
                             if span > 0 else 0.0,
                             "error": None}

    def phase_metrics(self, pp: dict[str, Any], hosts: list[str],
                      outputs: list[dict[str, Any]], flows: list[dict[str, Any]],
                      links: list[dict[str, Any]], work: Path) -> dict[str, Any]:
        job = pp["job"]
        job_flows = [f for f in flows if f["kind"] in ("allreduce", "incast")]
        if job["pattern"] == "ring":
            checkpoints = None
            if pp["storage"]["mode"] != "off":
                checkpoints = [(c["t_start"], c["t_end"]) for r in range(len(hosts))
                               for c in load(work / f"client{r}.json").get("checkpoints", [])]
            mt = jm.ring_metrics(outputs, len(hosts), max(job["sizes"] or [job["size_bytes"]]),
                                 self.bottleneck_bps(job_flows), job_flows, checkpoints)
            if job["sizes"]:
                mt["sweep"] = jm.sweep_rows(outputs, len(hosts), self.bottleneck_bps(job_flows))
            if job["program"] == "ddp":
                mt["ddp"] = jm.ddp_metrics(outputs)
        else:
            rx = job_flows[0]["dst"]
            rate = self.bw[(self.leaf_of[rx], rx)]
            mt = jm.incast_metrics(outputs[0], len(job_flows), job["size_bytes"]
                                   // len(job_flows), job["compute_s"], rate, job["warmup"])
        qports = pp["ecn"]["ports"] or self.hot_ports(links)
        mt["queues"] = {ln["intf"]: {"max_bytes": max(ln["series"]["queue_bytes"], default=0),
                                     "delay_ms": jm.queue_delay_ms(ln["series"]["queue_bytes"],
                                                                   ln["bw_mbps"] * 1e6),
                                     "drops": ln["drops"], "ce_marked": ln.get("ce_marked", 0)}
                        for ln in links if ln["intf"] in qports}
        mt["drops"] = sum(ln["drops"] for ln in links)
        mt["errors"] = [o["error"] for o in outputs if o.get("error")]
        return mt

    @staticmethod
    def hot_ports(links: list[dict[str, Any]], n: int = 3) -> list[str]:
        return [ln["intf"] for ln in sorted(links, key=lambda ln: -ln["util_mean"])[:n]]


def _flow_id(f: dict[str, Any]) -> dict[str, Any]:
    return {k: f[k] for k in ("id", "src_ip", "dst_ip", "proto", "sport", "dport")}
