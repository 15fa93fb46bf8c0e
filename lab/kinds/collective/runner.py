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
import json
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from lab import agents
from lab.analysis import diagnose
from lab.kinds.base import bring_up
from lab.kinds.collective import metrics as jm
from lab.kinds.collective import plan as kind
from lab.kinds.collective.plan import Conn
from lab.machine import programs
from lab.measure import ecnwire, telemetry
from lab.measure.result import flow_entries
from lab.measure.window import Window
from lab.model.errors import MachineError
from lab.model.flowpaths import attachment
from lab.model.flows import FlowSpec
from lab.model.result import SCHEMA_VERSION

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


def _read_proc(path: str) -> str:
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


class JobRun:
    """The running fabric plus what the job's phases need to know about it."""

    def __init__(self, plan_: Any, fabric: Any, progress: Any) -> None:
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

    def host(self, name: str) -> Any:
        return self.fabric.host(name)

    def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.fabric.controller is not None
        return self.fabric.controller.request(msg)

    def spawn(self, host: str, argv: list[str], log: Path, what: str) -> subprocess.Popen:
        return programs.spawn(self.fabric, host, argv, log, what)

    # -- planning -----------------------------------------------------------------------------
    def conns_for(self, pp: dict[str, Any], hosts: list[str]) -> list[Conn]:
        job = pp["job"]
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
        from controllers.ecn import dctcp_k_bytes
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
        accept: the job's when its receiver has a part (RECEIVER_CC), else as it was."""
        cc = pp["job"]["cc"]
        wanted = set(hosts) if cc in RECEIVER_CC else set()
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
    def storage_classes(self, pp: dict[str, Any], hosts: list[str], on: bool) -> None:
        """Storage traffic in a low-priority class of each GPU host's NIC, or back to one FIFO.

        The NIC is the link a GPU's ring and its checkpoint share. Classes are applied
        there (htb: the job's class borrows first; storage gets what is left, at least
        5 %); the switches' ports stay single FIFOs (OVS's ``set_queue`` does not steer
        packets in the userspace datapath).
        """
        for h in hosts:
            node = self.host(h)
            intf = node.defaultIntf()
            dev = intf.name
            rate = intf.params["bw"]
            limit = intf.params["queue_bytes"]
            burst = 70000
            node.cmd(f"tc qdisc del dev {dev} root 2>/dev/null")
            cmds = [f"tc qdisc add dev {dev} root handle 1: htb default " + ("11" if on else "1")]
            if on:
                cmds += [
                    f"tc class add dev {dev} parent 1: classid 1:1 htb rate {rate}mbit "
                    f"ceil {rate}mbit burst {burst} cburst {burst} quantum 100000",
                    f"tc class add dev {dev} parent 1:1 classid 1:11 htb rate {rate * 0.95}mbit"
                    f" ceil {rate}mbit burst {burst} cburst {burst} prio 0 quantum 100000",
                    f"tc class add dev {dev} parent 1:1 classid 1:12 htb rate {rate * 0.05}mbit"
                    f" ceil {rate}mbit burst {burst} cburst {burst} prio 1 quantum 100000",
                    f"tc qdisc add dev {dev} parent 1:11 handle 11: bfifo limit {limit}",
                    f"tc qdisc add dev {dev} parent 1:12 handle 12: bfifo limit {limit}",
                    f"tc filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip dport "
                    f"{kind.STORAGE_PORT} 0xffff flowid 1:12",
                ]
            else:
                cmds += [
                    f"tc class add dev {dev} parent 1: classid 1:1 htb rate {rate}mbit "
                    f"ceil {rate}mbit burst {burst} cburst {burst} quantum 100000",
                    f"tc qdisc add dev {dev} parent 1:1 handle 10: bfifo limit {limit}",
                ]
            for cmd in cmds:
                out = node.cmd(f"{cmd} 2>&1; echo __rc=$?")
                text, _, rc = out.rpartition("__rc=")
                if rc.strip() != "0":
                    raise MachineError("storage", f"{h}: `{cmd}` failed: {text.strip()}")

    def start_storage(self, pp: dict[str, Any], conns: list[Conn], work: Path,
                      duration_s: float
                      ) -> tuple[list[subprocess.Popen], list[subprocess.Popen], list[Path]]:
        """Storage servers, then one client per GPU, connected and held until
        :func:`lab.machine.programs.go`; returns the servers, the clients and their ready files."""
        st = pp["storage"]
        procs = []
        for srv in st["hosts"]:
            procs.append(self.spawn(srv, [*agents.command("storage"), "serve",
                                          "--listen", f"{self.ips[srv]}:{kind.STORAGE_PORT}",
                                          "--out", str(work / f"storage-{srv}.json")],
                                    work / f"storage-{srv}.log", f"storage server {srv}"))
        for srv in st["hosts"]:
            self.wait_listening(srv, kind.STORAGE_PORT)
        by_rank: dict[int, dict[str, Conn]] = {}
        for c in conns:
            by_rank.setdefault(c.rank, {})[c.spec.kind] = c
        clients = []
        for r, cs in sorted(by_rank.items()):
            read, ckpt = cs["storage-read"], cs["storage-checkpoint"]
            client = ckpt.spec.src
            clients.append(self.spawn(client, [
                *agents.command("storage"), "client",
                "--server", f"{ckpt.spec.dst_ip}:{kind.STORAGE_PORT}",
                "--bind", self.ips[client], "--read-sport", str(read.spec.dport),
                "--write-sport", str(ckpt.spec.sport), "--read-bps", str(st["read_mbps"] * 1e6),
                "--checkpoint-bytes", str(st["checkpoint_bytes"]),
                "--every-s", str(st["every_s"]), "--first-at-s", str(st["first_at_s"]),
                "--duration-s", str(duration_s), "--out", str(work / f"client{r}.json"),
                "--ready-file", str(work / f"client{r}.ready")],
                work / f"client{r}.log", f"storage client {r}"))
        return procs, clients, [work / f"client{r}.ready" for r in sorted(by_rank)]

    def wait_listening(self, host: str, port: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if f":{port}" in self.host(host).cmd(f"ss -Hltn 'sport = :{port}'"):
                return
            time.sleep(0.02)
        raise MachineError("traffic", f"nothing listens on {host}:{port} after {timeout_s:g} s")

    # -- the job --------------------------------------------------------------------------------
    def start_ring(self, pp: dict[str, Any], hosts: list[str], conns: list[Conn],
                   work: Path) -> list[subprocess.Popen]:
        job = pp["job"]
        n = len(hosts)
        procs = []
        for r, h in enumerate(hosts):
            sports = [c.spec.sport for c in sorted(conns, key=lambda c: c.epoch)
                      if c.rank == r]
            nxt = hosts[(r + 1) % n]
            argv = [*agents.command("worker"), "ring", "--rank", str(r),
                    "--world", str(n), "--listen", f"{self.ips[h]}:{kind.RING_PORT + r}",
                    "--next", f"{self.ips[nxt]}:{kind.RING_PORT + (r + 1) % n}",
                    "--bind", self.ips[h], "--sports", ",".join(map(str, sports)),
                    "--size", str(job["size_bytes"]), "--steps", str(job["steps"]),
                    "--warmup", str(job["warmup"]), "--compute-s", str(job["compute_s"]),
                    "--jitter-s", str(job["jitter_s"]), "--seed", str(self.plan.params["seed"]),
                    "--straggler-rank", str(job["straggler_rank"]),
                    "--straggler-s", str(job["straggler_s"]), "--buckets", str(job["buckets"]),
                    "--epoch-steps", str(job["epoch_steps"]), "--cc", job["cc"],
                    "--connect-timeout-s", "20", "--out", str(work / f"rank{r}.json")]
            procs.append(self.spawn(h, argv, work / f"rank{r}.log", f"ring rank {r}"))
        return procs

    def start_incast(self, pp: dict[str, Any], conns: list[Conn],
                     work: Path) -> list[subprocess.Popen]:
        job = pp["job"]
        rx = conns[0].spec.dst
        burst = job["size_bytes"] // len(conns)
        procs = [self.spawn(rx, [*agents.command("worker"), "incast-sink",
                                 "--listen", f"{self.ips[rx]}:{kind.SINK_PORT}",
                                 "--senders", str(len(conns)), "--burst", str(burst),
                                 "--steps", str(job["steps"]), "--gap-s", str(job["compute_s"]),
                                 "--out", str(work / "sink.json")],
                            work / "sink.log", "incast sink")]
        self.wait_listening(rx, kind.SINK_PORT)
        for c in conns:
            f = c.spec
            procs.append(self.spawn(f.src, [*agents.command("worker"), "incast-send", "--connect",
                                            f"{f.dst_ip}:{kind.SINK_PORT}", "--bind", f.src_ip,
                                            "--sport", str(f.sport), "--cc", job["cc"],
                                            "--out", str(work / f"{f.id}.json")],
                                    work / f"{f.id}.log", f"incast sender {f.id}"))
        return procs

    def microbursts(self, pp: dict[str, Any], hosts: list[str], rx: str,
                    work: Path) -> dict[str, Any]:
        """Fixed-shape UDP bursts (scapy-crafted, ECT(0)) from a few senders into the
        receiver's port at once: where in a burst CE marks and drops begin."""
        mb = pp["microburst"]
        senders = [h for h in hosts if h != rx][:mb["senders"]]
        expect = len(senders) * mb["count"] * mb["bursts"]
        recv = self.spawn(rx, [*agents.command("microburst"), "--recv",
                               "--bind", self.ips[rx], "--port", str(kind.BURST_PORT),
                               "--expect", str(expect), "--timeout-s", "6",
                               "--out", str(work / "burst-recv.json")],
                          work / "burst-recv.log", "micro-burst receiver")
        time.sleep(0.3)
        procs = []
        # Far enough ahead for every sender to import scapy and build its frames.
        start_at = time.monotonic() + 1.5
        for i, h in enumerate(senders):
            node = self.host(h)
            procs.append(self.spawn(h, [
                *agents.command("microburst"), "--iface", node.defaultIntf().name,
                "--src-mac", self.macs[h], "--dst-mac", self.macs[rx], "--src-ip", self.ips[h],
                "--dst-ip", self.ips[rx], "--sport", str(kind.BURST_PORT + 1 + i),
                "--dport", str(kind.BURST_PORT), "--count", str(mb["count"]),
                "--size", str(mb["size"]), "--ecn", "ect0", "--bursts", str(mb["bursts"]),
                "--gap-s", "0.5", "--start-at", f"{start_at:.6f}",
                "--out", str(work / f"burst-{h}.json")],
                work / f"burst-{h}.log", f"micro-burst sender {h}"))
        for p in procs:
            _wait(p, 30)
        _wait(recv, 15)
        out = {"senders": senders, "recv": _load(work / "burst-recv.json"),
               "sent": {h: _load(work / f"burst-{h}.json") for h in senders}}
        return out

    def run_phase(self, name: str, pp: dict[str, Any]) -> dict[str, Any]:
        job = pp["job"]
        work = self.work / name
        work.mkdir(parents=True, exist_ok=True)
        where = "ecn" if name == "run" else f"phases.{name}.ecn"
        hosts = kind.place_workers(self.topo, pp, self.rng)
        conns = self.conns_for(pp, hosts)
        sconns = self.storage_conns(pp, hosts)
        all_conns = conns + sconns
        pinned = self.set_paths(pp, conns)
        k_rule = None
        if pp["ecn"]["k_rule"] == "dctcp" and pp["ecn"]["marking"] == "step":
            pp, k_rule = self.dctcp_k(pp, conns)
        marking = self.set_marking(pp, where)
        self.set_default_cc(pp, hosts)
        ecn_flag = 1 if job["ecn"] else 0
        for h in {*hosts, *pp["storage"]["hosts"]}:
            self.host(h).cmd(f"sysctl -qw net.ipv4.tcp_ecn={ecn_flag}")
        watch = [e for c in all_conns for e in c.spec.watch_entries(c.index)]
        self.request({"cmd": "watch", "flows": watch})
        estimate = job["steps"] * (job["compute_s"] + job["straggler_s"] + 2.0) + 20
        if pp["storage"]["mode"] == "classes":
            self.storage_classes(pp, hosts, on=True)
        bridges = [s["name"] for s in self.topo["switches"]]
        sampler = telemetry.Sampler(self.ports, hz=float(pp["sample_hz"]),
                                    controller=self.fabric.controller)
        window = Window(sampler, self.ports, bridges)
        watched_hosts = sorted({*hosts, *pp["storage"]["hosts"]})
        procs: list[subprocess.Popen] = []
        capture = None
        bursts: dict[str, Any] | None = None
        try:
            sampler.start()
            time.sleep(0.05)
            window.open()
            ecn0 = self.ecn_counters()
            tcp0 = {h: tcp_counters(self.host(h).pid) for h in watched_hosts}
            clients: list[subprocess.Popen] = []
            storage_ready: list[Path] = []
            if sconns:
                servers, clients, storage_ready = self.start_storage(pp, sconns, work, estimate)
                procs += servers + clients
            if job["pattern"] == "incast":
                rx = conns[0].spec.dst
                capture = ecnwire.start_capture(self.host(rx).popen,
                                                self.host(rx).defaultIntf().name,
                                                work / "receiver.pcap")
                self.fabric.record.add_pid(capture.pid, "tcpdump at the incast receiver")
                workers = self.start_incast(pp, conns, work)
            else:
                workers = self.start_ring(pp, hosts, conns, work)
            if storage_ready:           # every GPU's checkpoints together, with the job
                programs.go(storage_ready, clients)
            procs += workers
            self.progress(f"[{name}] {len(hosts)} workers on {', '.join(hosts)}: "
                          f"{job['steps']} steps of {job['pattern']} "
                          f"{job['size_bytes'] / 1e6:g} MB"
                          + (f", {len(pinned)} paths placed" if pinned else "")
                          + (f", ECN marking {marking}" if marking else ""))
            deadline = time.monotonic() + estimate
            for p in workers:
                _wait(p, max(1.0, deadline - time.monotonic()))
            t_job_end = time.monotonic() - sampler.t0
            if job["pattern"] == "incast" and pp["microburst"]["senders"]:
                bursts = self.microbursts(pp, hosts, conns[0].spec.dst, work)
            for p in procs:                      # storage: stop it with the job
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                _wait(p, 5)
            if capture is not None:
                capture.stop()
            window.close()
            ecn1 = self.ecn_counters()
            tcp1 = {h: tcp_counters(self.host(h).pid) for h in watched_hosts}
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            if capture is not None and capture.proc.poll() is None:
                capture.proc.kill()
            sampler.stop()
            if pp["storage"]["mode"] == "classes":
                self.storage_classes(pp, hosts, on=False)
        outputs = self.read_outputs(pp, conns, work)
        self.attach_results(conns, outputs)
        flows = flow_entries([c.spec for c in all_conns], window.flow_deltas(), self.topo,
                             [c.index for c in all_conns])
        for f, c in zip(flows, all_conns, strict=True):
            f["epoch"], f["rank"] = c.epoch, c.rank
        links = window.links()
        for ln in links:
            c0, c1 = ecn0.get(ln["intf"], {}), ecn1.get(ln["intf"], {})
            ln["ce_marked"] = c1.get("ce_marked", 0) - c0.get("ce_marked", 0)
            ln["ecn_marking"] = marking if ln["intf"] in self.marked else None
        # The fidelity window is the job's steps: from when its last worker passed the start
        # barrier to its last step's end. Starting a dozen Python programs on two cores, and
        # their exit, are the lab's set-up and teardown, not emulation; under TCG either
        # takes seconds of both vCPUs.
        t_ready = [o["t_ready"] - sampler.t0 for o in outputs if o.get("t_ready") is not None]
        t_fid = min(max([window.t_start, *t_ready]), t_job_end)
        ends = [st["t_end"] - sampler.t0 for o in outputs for st in o.get("steps") or []
                if isinstance(st, dict) and st.get("t_end") is not None]
        t_fid_end = min(max([t_fid, *ends]), t_job_end) if ends else t_job_end
        judged = window.judge(t_fid, t_fid_end)
        idle = judged["cpu_idle_pct"]
        metrics = self.phase_metrics(pp, hosts, outputs, flows, links, work)
        metrics["retransmits"] = sum(f["retransmits"] for f in flows
                                     if f["kind"] in ("allreduce", "incast"))
        metrics["tcp"] = _sum_delta(tcp0, tcp1)
        metrics["ce_marked"] = sum(ln["ce_marked"] for ln in links)
        metrics["marking"] = {"mechanism": self.plan.env.ecn, "config": marking,
                              "ports": sorted(self.marked)}
        if k_rule is not None:
            metrics["marking"]["k_rule"] = k_rule
        metrics["cc"] = job["cc"]
        metrics["paths"] = pp["placement"]["paths"]
        by_tuple = {(f["src_ip"], f["sport"], f["dst_ip"], f["dport"]): f["id"] for f in flows}
        metrics["pins"] = [{"flow": by_tuple.get((p["src"], p["sport"], p["dst"], p["dport"])),
                            "switch": p["switch"], "port": p["port"]} for p in pinned]
        metrics["placement"] = pp["placement"]["hosts"]
        metrics["hosts"] = hosts
        metrics["cpu_idle_min_pct"] = judged["cpu_idle_min_pct"]
        metrics["lab_cpu_pct"] = judged["lab_cpu_pct"]
        metrics["fidelity_window_s"] = judged["window_s"]
        metrics["fidelity_valid"] = (metrics["cpu_idle_min_pct"] >= telemetry.MIN_CPU_IDLE_PCT
                                     and not any(o.get("error") for o in outputs))
        if capture is not None:
            metrics["wire"] = ecnwire.summarize(work / "receiver.pcap",
                                                [_flow_id(f) for f in flows])
            (work / "receiver.pcap").unlink(missing_ok=True)   # captures are not kept
        if bursts is not None:
            metrics["microburst"] = bursts
        return {"duration_s": round(window.measured_s, 3), "links": links, "flows": flows,
                "metrics": metrics, "cpu_idle_pct": idle, "outputs": outputs}

    def read_outputs(self, pp: dict[str, Any], conns: list[Conn],
                     work: Path) -> list[dict[str, Any]]:
        if pp["job"]["pattern"] == "ring":
            return [_load(work / f"rank{r}.json") for r in range(len({c.rank for c in conns}))]
        return [_load(work / "sink.json")] + [_load(work / f"{c.spec.id}.json") for c in conns]

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
                               for c in _load(work / f"client{r}.json").get("checkpoints", [])]
            mt = jm.ring_metrics(outputs, len(hosts), job["size_bytes"],
                                 self.bottleneck_bps(job_flows), job_flows, checkpoints)
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


def _wait(proc: subprocess.Popen, timeout_s: float) -> None:
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _load(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"error": f"no output in {path.name}"}


def prepare(plan_: Any) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Every phase's parameters, and the phases this machine cannot run (and why); refuses
    a congestion control or a marking the machine cannot give, before anything starts."""
    phases_pp = kind.check(plan_.params, plan_.topo_desc)
    skipped = kind.phases_to_skip(plan_.params, phases_pp, plan_.env.congestion_controls)
    phases_pp = {n: pp for n, pp in phases_pp.items() if n not in skipped}
    for name, pp in phases_pp.items():
        if pp["job"]["cc"] in RECEIVER_CC:
            allowed = _read_proc("/proc/sys/net/ipv4/tcp_allowed_congestion_control").split()
            if pp["job"]["cc"] not in allowed:
                raise MachineError("job.cc", f"{pp['job']['cc']} is in this kernel but not "
                                   "allowed in network namespaces (net.ipv4.tcp_allowed_"
                                   "congestion_control; `make setup` allows every available "
                                   f"one); phase {name}")
        if kind.check_marking(pp["ecn"], "ecn") and plan_.env.ecn == "none":
            raise MachineError("ecn.marking", "this machine has no ECN marking mechanism "
                               "(RED, or clang and bpftool for the tc-BPF marker)")
    return phases_pp, skipped


def run(plan_: Any, fabric: Any, progress: Any,
        prepared: tuple[dict[str, dict[str, Any]], dict[str, str]]) -> dict[str, Any]:
    """Bring the fabric up, then the job's phases one after another on it."""
    phases_pp, skipped = prepared
    phases: dict[str, Any] = {}
    loss = bring_up(plan_, fabric, progress)
    job = JobRun(plan_, fabric, progress)
    for name, pp in phases_pp.items():
        t0 = time.monotonic()
        phases[name] = job.run_phase(name, pp)
        fabric.timings[f"phase_{name}_s"] = time.monotonic() - t0
        progress(f"[{name}] " + jm.phase_line(phases[name]["metrics"]))
    return assemble(plan_, phases, loss, {}, skipped)


def keep_logs(work: Path, out_dir: Path) -> None:
    """The workers' and storage programs' records and logs (captures stay behind)."""
    if (work / "job").is_dir():
        shutil.copytree(work / "job", out_dir / "job", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.pcap"))


def assemble(plan_: Any, phases: dict[str, Any], loss: float,
             timings: dict[str, Any], skipped: dict[str, str] | None = None) -> dict[str, Any]:
    """result.json: top-level links, flows and metrics are the first phase's (the problem
    the scenario shows); ``metrics.phases`` and ``phase_details`` hold every phase that ran,
    ``metrics.phases_skipped`` why the others did not."""
    skipped = skipped or {}
    first = next(iter(phases))
    main = phases[first]
    metrics = dict(main["metrics"])
    metrics["phases"] = {n: p["metrics"] for n, p in phases.items()}
    metrics["pingall_loss_pct"] = loss
    metrics["phases_skipped"] = dict(skipped)
    notes = list(plan_.env.notes)
    notes += [f"{n}: {why}" for n, why in skipped.items()]
    for n, p in phases.items():
        m = p["metrics"]
        if m["cpu_idle_min_pct"] < telemetry.MIN_CPU_IDLE_PCT:
            notes.append(f"{n}: CPU-bound ({m['cpu_idle_min_pct']:.0f}% idle)")
        notes += [f"{n}: {e}" for e in m["errors"]]
    result: dict[str, Any] = {
        "schema": SCHEMA_VERSION, "kind": "collective", "scenario": plan_.scenario.name,
        **plan_.policy_fields(), "seed": int(plan_.params["seed"]),
        "duration_s": main["duration_s"], "phase": first,
        "environment": plan_.env.as_result(), "topology": plan_.topo_desc,
        "params": plan_.params, "links": main["links"], "flows": main["flows"],
        "metrics": metrics, "timings": timings,
        "phase_details": {n: {k: p[k] for k in ("duration_s", "links", "flows", "cpu_idle_pct")}
                          for n, p in phases.items()},
        "fidelity": {"cpu_idle_min_pct": min(p["metrics"]["cpu_idle_min_pct"]
                                             for p in phases.values()),
                     "lab_cpu_pct": telemetry.worst_lab_cpu_pct(
                         p["metrics"]["lab_cpu_pct"] for p in phases.values()),
                     "valid": loss == 0 and all(p["metrics"]["fidelity_valid"]
                                                for p in phases.values()),
                     "notes": notes, "step_clock": "time.monotonic (ns resolution)"},
    }
    result["fidelity"]["datapath_loss_bytes"] = diagnose.unexplained_loss(result)
    return result
