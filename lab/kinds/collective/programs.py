"""The programs of a collective phase, started in the hosts: storage servers and clients,
ring ranks, incast sink and senders, micro-burst senders and receiver; and the NIC classes
that put storage behind the ring.

A part of ``JobRun`` (``lab.kinds.collective.run``): it uses the run's hosts, addresses and spawn.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controllers.marking import htb_class_args
from lab import agents
from lab.kinds.base import Plan
from lab.kinds.collective import liveview, mptcpjob
from lab.kinds.collective import plan as planning
from lab.kinds.collective.gloo import GLOO_PORT
from lab.kinds.collective.plan import Conn
from lab.machine import programs
from lab.measure import telemetry
from lab.model.errors import MachineError
from lab.net.links import change_rate, tc_commands, wire_qdiscs
from lab.net.wire import count_wire_bytes

if TYPE_CHECKING:
    from lab.net.fabric import Fabric


class JobPrograms:
    """Starting and stopping a phase's programs (mixed into ``JobRun``)."""

    fabric: Fabric
    plan: Plan
    ips: dict[str, str]
    ports: list[telemetry.Port]
    job_ips: Callable[[dict[str, Any]], dict[str, str]]  # JobSetup's: the job's addresses
    storage_ips: Callable[[dict[str, Any]], dict[str, str]]  # JobSetup's: storage's

    def host(self, name: str) -> Any:
        return self.fabric.host(name)


    def spawn(self, host: str, argv: list[str], log: Path, what: str,
              cls: str) -> subprocess.Popen:
        return programs.spawn(self.fabric, host, argv, log, what, cls)

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
            node.cmd(f"tc qdisc del dev {dev} root 2>/dev/null")
            if on:
                cmds = [
                    f"tc qdisc add dev {dev} root handle 1: htb default 11",
                    f"tc class add dev {dev} parent 1: classid 1:1 {htb_class_args(rate)}",
                    f"tc class add dev {dev} parent 1:1 classid 1:11 "
                    f"{htb_class_args(rate * 0.95, rate)} prio 0",
                    f"tc class add dev {dev} parent 1:1 classid 1:12 "
                    f"{htb_class_args(rate * 0.05, rate)} prio 1",
                    f"tc qdisc add dev {dev} parent 1:11 handle 11: bfifo limit {limit}",
                    f"tc qdisc add dev {dev} parent 1:12 handle 12: bfifo limit {limit}",
                    f"tc filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip dport "
                    f"{planning.STORAGE_PORT} 0xffff flowid 1:12",
                ]
            else:       # back to the layout every lab port has (lab/net/links.py)
                cmds = tc_commands(dev, rate, limit)
            for cmd in cmds:
                out = node.cmd(f"{cmd} 2>&1; echo __rc=$?")
                text, _, rc = out.rpartition("__rc=")
                if rc.strip() != "0":
                    raise MachineError("storage", f"{h}: `{cmd}` failed: {text.strip()}")
            count_wire_bytes(node.pid, wire_qdiscs(dev, None))

    def storage_links(self, pp: dict[str, Any], bw_mbps: float | None) -> None:
        """Both ends of every storage host's link on the storage network (its fabric link,
        or its management NIC's with ``storage.network: mgmt``) at ``bw_mbps`` for a phase
        (a storage rack too slow for its readers), or back to the rate the topology built
        (None)."""
        mgmt = {h["name"]: h["intf"] for h in (self.plan.topo_desc.get("mgmt") or {})
                .get("hosts", [])}
        for srv in pp["storage"]["hosts"]:
            node = self.host(srv)
            intf = node.intf(mgmt[srv]) if pp["storage"]["network"] == "mgmt" \
                else node.defaultIntf()
            for end in (intf.link.intf1, intf.link.intf2):
                rate = end.params["bw"] if bw_mbps is None else bw_mbps
                change_rate(end.node, end.name, rate, "storage.link_mbps")

    def phase_ports(self, pp: dict[str, Any]) -> list[telemetry.Port]:
        """The fabric's ports, and the management LAN's when the job or storage uses it, at
        the phase's rates: the ports facing the storage hosts on the storage network at
        ``storage.link_mbps`` when a phase sets it, so utilisation is of the rate in force."""
        st = pp["storage"]
        slow, storage = st["link_mbps"], set(st["hosts"])
        mgmt = telemetry.mgmt_ports(self.plan.topo_desc) \
            if "mgmt" in (pp["job"]["interface"], st["network"]) else []
        return [dataclasses.replace(p, bw_mbps=slow)
                if slow and p.peer in storage and p.role == st["network"] else p
                for p in self.ports + mgmt]

    def start_storage_servers(self, pp: dict[str, Any], work: Path) -> list[subprocess.Popen]:
        """One ``storage serve`` per storage host, listening before this returns.

        The same server answers a client's reads and checkpoints and a data loader's batch
        requests (each connection says which it is), so a phase with a loader starts them
        even when ``storage.mode`` is off: its only storage traffic is then the batches.
        It listens on the storage network's address (``storage.network``) alone, so nothing
        of storage can reach it over the other network.
        """
        procs = []
        ips = self.storage_ips(pp)
        for srv in pp["storage"]["hosts"]:
            procs.append(self.spawn(srv, [*agents.command("storage"), "serve",
                                          "--listen", f"{ips[srv]}:{planning.STORAGE_PORT}",
                                          "--out", str(work / f"storage-{srv}.json")],
                                    work / f"storage-{srv}.log", f"storage server {srv}",
                                    "storage"))
        for srv in pp["storage"]["hosts"]:
            self.wait_listening(srv, planning.STORAGE_PORT)
        return procs

    def start_storage(self, pp: dict[str, Any], conns: list[Conn], work: Path,
                      duration_s: float) -> tuple[list[subprocess.Popen], list[Path]]:
        """One storage client per GPU (the servers are up), connected and held until
        :func:`lab.machine.programs.go`; returns the clients and their ready files."""
        st = pp["storage"]
        by_rank: dict[int, dict[str, Conn]] = {}
        for c in conns:
            by_rank.setdefault(c.rank, {})[c.spec.kind] = c
        clients = []
        for r, cs in sorted(by_rank.items()):
            read, ckpt = cs["storage-read"], cs["storage-checkpoint"]
            client = ckpt.spec.src
            clients.append(self.spawn(client, [
                *agents.command("storage"), "client",
                "--server", f"{ckpt.spec.dst_ip}:{planning.STORAGE_PORT}",
                "--bind", ckpt.spec.src_ip, "--read-sport", str(read.spec.dport),
                "--write-sport", str(ckpt.spec.sport), "--read-bps", str(st["read_mbps"] * 1e6),
                "--checkpoint-bytes", str(st["checkpoint_bytes"]),
                "--every-s", str(st["every_s"]), "--first-at-s", str(st["first_at_s"]),
                "--duration-s", str(duration_s), "--out", str(work / f"client{r}.json"),
                "--ready-file", str(work / f"client{r}.ready")],
                work / f"client{r}.log", f"storage client {r}", "storage"))
        return clients, [work / f"client{r}.ready" for r in sorted(by_rank)]

    def wait_listening(self, host: str, port: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if f":{port}" in self.host(host).cmd(f"ss -Hltn 'sport = :{port}'"):
                return
            time.sleep(0.02)
        raise MachineError("traffic", f"nothing listens on {host}:{port} after {timeout_s:g} s")

    # -- the job --------------------------------------------------------------------------------
    def start_ring(self, pp: dict[str, Any], hosts: list[str], conns: list[Conn],
                   work: Path, lconns: list[Conn]) -> list[subprocess.Popen]:
        job = pp["job"]
        n = len(hosts)
        ips = self.job_ips(pp)
        procs = []
        for r, h in enumerate(hosts):
            sports = [c.spec.sport for c in sorted(conns, key=lambda c: c.epoch)
                      if c.rank == r]
            nxt = hosts[(r + 1) % n]
            argv = [*agents.command("worker"), "ring", "--rank", str(r),
                    "--world", str(n), "--listen", f"{ips[h]}:{planning.RING_PORT + r}",
                    "--next", f"{ips[nxt]}:{planning.RING_PORT + (r + 1) % n}",
                    "--bind", ips[h], "--sports", ",".join(map(str, sports)),
                    "--size", str(job["size_bytes"]), "--steps", str(job["steps"]),
                    "--warmup", str(job["warmup"]), "--compute-s", str(job["compute_s"]),
                    "--jitter-s", str(job["jitter_s"]), "--seed", str(self.plan.params["seed"]),
                    "--straggler-rank", str(job["straggler_rank"]),
                    "--straggler-s", str(job["straggler_s"]), "--buckets", str(job["buckets"]),
                    "--epoch-steps", str(job["epoch_steps"]), "--cc", job["cc"],
                    *sweep_args(job), *loader_args(pp, [c for c in lconns if c.rank == r]),
                    *liveview.live_file_args(work, r),
                    "--connect-timeout-s", "20", "--out", str(work / f"rank{r}.json")]
            procs.append(self.spawn(h, argv, work / f"rank{r}.log", f"ring rank {r}", "ranks"))
        return procs

    def start_gloo(self, pp: dict[str, Any], hosts: list[str], work: Path,
                   lconns: list[Conn]) -> tuple[list[subprocess.Popen], list[Path], list[Path]]:
        """The job's ranks on gloo (all-reduce, or DDP training: ``job.program``, whose
        ranks may have a data loader reading over ``lconns`` and a live file), rendezvous
        on rank 0's fabric address; each reports gloo's connections, then holds for
        :func:`lab.machine.programs.go`. Returns the ranks, their ready files and their
        connection reports."""
        job = pp["job"]
        n = len(hosts)
        peers = ",".join(self.ips[h] for h in hosts)
        ddp = job["program"] == "ddp"
        prog, extra = (("ddp", ["--bucket-cap-mb", str(job["bucket_cap_mb"]),
                                "--first-bucket-mb", str(job["first_bucket_mb"])]) if ddp
                       else ("gloo", sweep_args(job)))
        procs = []
        for r, h in enumerate(hosts):
            argv = [*agents.command("worker"), prog, "--rank", str(r), "--world", str(n),
                    "--master", f"{self.ips[hosts[0]]}:{GLOO_PORT}", "--peers", peers,
                    "--iface", self.host(h).defaultIntf().name,
                    "--size", str(job["size_bytes"]), "--steps", str(job["steps"]),
                    "--warmup", str(job["warmup"]), "--compute-s", str(job["compute_s"]),
                    "--jitter-s", str(job["jitter_s"]), "--seed", str(self.plan.params["seed"]),
                    "--straggler-rank", str(job["straggler_rank"]),
                    "--straggler-s", str(job["straggler_s"]),
                    "--epoch-steps", str(job["epoch_steps"]), *extra,
                    *loader_args(pp, [c for c in lconns if c.rank == r]),
                    *(liveview.live_file_args(work, r) if ddp else []),
                    # torch's import and rendezvous of N ranks on two cores: tens of seconds
                    "--connect-timeout-s", str(programs.ready_timeout_s()),
                    "--conns-out", str(work / f"rank{r}.conns.json"),
                    "--ready-file", str(work / f"rank{r}.ready"),
                    "--out", str(work / f"rank{r}.json")]
            procs.append(self.spawn(h, mptcpjob.wrap(pp, argv), work / f"rank{r}.log",
                                    f"{prog} rank {r}", "ranks"))
        return (procs, [work / f"rank{r}.ready" for r in range(n)],
                [work / f"rank{r}.conns.json" for r in range(n)])

    def start_incast(self, pp: dict[str, Any], conns: list[Conn],
                     work: Path) -> list[subprocess.Popen]:
        job = pp["job"]
        rx = conns[0].spec.dst
        burst = job["size_bytes"] // len(conns)
        procs = [self.spawn(rx, [*agents.command("worker"), "incast-sink",
                                 "--listen", f"{self.ips[rx]}:{planning.SINK_PORT}",
                                 "--senders", str(len(conns)), "--burst", str(burst),
                                 "--steps", str(job["steps"]), "--gap-s", str(job["compute_s"]),
                                 "--out", str(work / "sink.json")],
                            work / "sink.log", "incast sink", "ranks")]
        self.wait_listening(rx, planning.SINK_PORT)
        for c in conns:
            f = c.spec
            procs.append(self.spawn(f.src, [*agents.command("worker"), "incast-send", "--connect",
                                            f"{f.dst_ip}:{planning.SINK_PORT}", "--bind", f.src_ip,
                                            "--sport", str(f.sport), "--cc", job["cc"],
                                            "--out", str(work / f"{f.id}.json")],
                                    work / f"{f.id}.log", f"incast sender {f.id}",
                                    "ranks"))
        return procs

    def microbursts(self, pp: dict[str, Any], hosts: list[str], rx: str,
                    work: Path) -> dict[str, Any]:
        """Fixed-shape UDP bursts (scapy-crafted, ECT(0)) from a few senders into the
        receiver's port at once: where in a burst CE marks and drops begin."""
        mb = pp["microburst"]
        senders = [h for h in hosts if h != rx][:mb["senders"]]
        expect = len(senders) * mb["count"] * mb["bursts"]
        recv = self.spawn(rx, [*agents.command("microburst"), "--recv",
                               "--bind", self.ips[rx], "--port", str(planning.BURST_PORT),
                               "--expect", str(expect), "--timeout-s", "6",
                               "--out", str(work / "burst-recv.json")],
                          work / "burst-recv.log", "micro-burst receiver", "traffic")
        time.sleep(0.3)
        procs = []
        # Far enough ahead for every sender to import scapy and build its frames.
        start_at = time.monotonic() + 1.5
        for i, h in enumerate(senders):
            node = self.host(h)
            procs.append(self.spawn(h, [
                *agents.command("microburst"), "--iface", node.defaultIntf().name,
                "--src-mac", self.macs[h], "--dst-mac", self.macs[rx], "--src-ip", self.ips[h],
                "--dst-ip", self.ips[rx], "--sport", str(planning.BURST_PORT + 1 + i),
                "--dport", str(planning.BURST_PORT), "--count", str(mb["count"]),
                "--size", str(mb["size"]), "--ecn", "ect0", "--bursts", str(mb["bursts"]),
                "--gap-s", "0.5", "--start-at", f"{start_at:.6f}",
                "--out", str(work / f"burst-{h}.json")],
                work / f"burst-{h}.log", f"micro-burst sender {h}", "traffic"))
        for p in procs:
            wait(p, 30)
        wait(recv, 15)
        out = {"senders": senders, "recv": load(work / "burst-recv.json"),
               "sent": {h: load(work / f"burst-{h}.json") for h in senders}}
        return out


def sweep_args(job: dict[str, Any]) -> list[str]:
    """``--sizes`` for a size sweep, nothing otherwise."""
    return ["--sizes", ",".join(map(str, job["sizes"]))] if job["sizes"] else []


def loader_args(pp: dict[str, Any], conns: list[Conn]) -> list[str]:
    """A rank's data loader options from its planned connections, nothing without a loader.

    Worker i reads from the i-th ``--storage`` address from the i-th ``--loader-sports``
    port: one address per worker, so the plan, not the agent, says which host serves it.
    """
    if not conns:
        return []
    ld = pp["loader"]
    return ["--storage", ",".join(f"{c.spec.src_ip}:{c.spec.sport}" for c in conns),
            "--loader-sports", ",".join(str(c.spec.dport) for c in conns),
            "--loader-bind", conns[0].spec.dst_ip,
            "--loader-workers", str(ld["workers"]), "--prefetch", str(ld["prefetch"]),
            "--batch-bytes", str(ld["batch_bytes"]), "--cpu-ms", str(ld["cpu_ms"])]


def wait(proc: subprocess.Popen, timeout_s: float) -> None:
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def load(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"error": f"no output in {path.name}"}
