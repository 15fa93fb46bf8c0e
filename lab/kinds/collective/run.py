"""The collective kind's run: the fabric brought up, then the job's phases one after another
on it - placement, paths, marking, traffic, counters - and the logs kept afterwards.

One fabric for every phase (bring-up is the slow part and the comparison is fairer on the
same switches); each phase starts its own workers, so placement may change between phases.
Per phase, in this order: place the ranks; plan every connection's 5-tuple; ask the
controller to pin (or unpin) paths and to set ECN marking; watch every connection on every
switch (``JobSetup``, ``lab.kinds.collective.setup``); start storage, sampling and
capture; run the job to its last step (``JobPrograms``, ``lab.kinds.collective.programs``);
read every counter once the queues have drained (``JobReadout``,
``lab.kinds.collective.readout``); stop what the phase started.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab.kinds.base import Plan, Progress, bring_up
from lab.kinds.collective import gloo, liveview, mptcpjob, otherjob, roce
from lab.kinds.collective import metrics as jm
from lab.kinds.collective import plan as planning
from lab.kinds.collective.programs import JobPrograms, load, wait
from lab.kinds.collective.readout import Drive, JobReadout
from lab.kinds.collective.rocejob import RoceJob
from lab.kinds.collective.setup import JobSetup, Phase
from lab.machine import programs, remote
from lab.measure import ecnwire, queuefeed, telemetry
from lab.measure.window import Window
from lab.model.errors import MachineError
from lab.model.flowpaths import attachment
from lab.net.lossless import LosslessClass
from lab.workloads.traffic import FlowRunner

if TYPE_CHECKING:
    from lab.net.fabric import Fabric

#: Source ports come from below the kernel's ephemeral range, so a fixed ``bind`` never
#: races a port the kernel handed to another socket.
SPORT_RANGE = range(20000, 32000)
#: How much longer than the job's estimate an elephant is asked to run: it is stopped
#: when the job ends, so it never ends first.
ELEPHANT_SPARE_S = 30.0
TCP_COUNTERS = {"TcpExt": ("TCPTimeouts", "TCPLossProbes", "TCPFastRetrans"),
                "Tcp": ("RetransSegs", "OutSegs")}


def on_fabric(plan_: Plan, fabric: Fabric, progress: Progress,
              prepared: tuple[dict[str, dict[str, Any]], dict[str, str]]) -> dict[str, Any]:
    """Bring the fabric up, then the job's phases one after another on it; returns the
    kind's part of result.json."""
    phases_pp, skipped = prepared
    phases: dict[str, Any] = {}
    loss = bring_up(plan_, fabric, progress)
    job = JobRun(plan_, fabric, progress)
    lossless = [pp for pp in phases_pp.values() if roce.uses_lossless(pp)]
    if lossless:       # the classes are the fabric's: laid once, sized by the first RoCE phase
        job.lossless = LosslessClass(fabric, plan_.topo_desc, job.request)
        job.lossless.classes_on(lossless[0])
    for name, pp in phases_pp.items():
        t0 = time.monotonic()
        phases[name] = job.run_phase(name, pp)
        fabric.timings[f"phase_{name}_s"] = time.monotonic() - t0
        progress(f"[{name}] " + jm.phase_line(phases[name]["metrics"]))
    result = jm.assemble(plan_, phases, loss, skipped)
    if job.feed is not None and fabric.controller is not None:
        # Flows a queue-reading policy moved, over the whole run (monotonic clock).
        moves = fabric.controller.request({"cmd": "status"}).get("moves", [])
        result["controller"] = {"adaptive": job.feed.report(moves)}
    return result


def keep_logs(work: Path, out_dir: Path) -> None:
    """The workers' and storage programs' records and logs (captures stay behind)."""
    if (work / "job").is_dir():
        shutil.copytree(work / "job", out_dir / "job", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.pcap"))


def tcp_counters(node: Any) -> dict[str, int]:
    """A host's namespace's own TCP counters (its /proc/net), e.g. RTO timeouts."""
    out: dict[str, int] = {}
    for name in ("netstat", "snmp"):
        try:
            lines = remote.proc_net(node, name).splitlines()
        except OSError:
            continue
        for head, vals in zip(lines[::2], lines[1::2], strict=False):
            section, _, keys = head.partition(": ")
            wanted = TCP_COUNTERS.get(section, ())
            for k, v in zip(keys.split(), vals.partition(": ")[2].split(), strict=False):
                if k in wanted:
                    out[k] = int(v)
    return out


class JobRun(JobSetup, JobPrograms, JobReadout, RoceJob):
    """The running fabric plus what the job's phases need to know about it.

    Its parts by what a phase does: set up the network (``JobSetup``), start and stop the
    programs (``JobPrograms``), read what they and the switches counted (``JobReadout``);
    here the phase itself, from set-up to read-out, inside one measurement window.
    """

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
        #: The queue samples a queue-reading policy (adaptive) is handed, every phase's.
        self.feed = queuefeed.feed_for(plan_.policy, fabric.controller, plan_.params,
                                       self.topo)
        self.bw = {}
        for ln in [*self.topo["links"], *(self.topo.get("mgmt") or {}).get("links", [])]:
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

    def ecn_counters(self) -> dict[str, dict[str, int]]:
        if not self.marked and self.plan.env.ecn == "none":
            return {}
        return self.request({"cmd": "ecn_stats"}).get("ports", {})

    def run_phase(self, name: str, pp: dict[str, Any]) -> dict[str, Any]:
        """One phase: its network settings, the job (and storage) on the fabric inside one
        measurement window, then its links, flows and metrics."""
        ph = self.configure(name, pp)
        if ph.pp["storage"]["mode"] == "classes":
            self.storage_classes(ph.pp, ph.hosts, on=True)
        slow = ph.pp["storage"]["link_mbps"]
        try:
            if slow:
                self.storage_links(ph.pp, slow)
            drive = self.drive(name, ph)
        finally:
            if ph.pp["storage"]["mode"] == "classes":
                self.storage_classes(ph.pp, ph.hosts, on=False)
            if slow:
                self.storage_links(ph.pp, None)
        return self.phase_result(ph, drive)

    def drive(self, name: str, ph: Phase) -> Drive:
        """The job's programs (and storage's) from start to exit, inside one window."""
        pp, job, work = ph.pp, ph.pp["job"], ph.work
        estimate = self.estimate_s(job, pp["loader"])
        bridges = [s["name"] for s in self.topo["switches"]]
        ports = self.phase_ports(pp)
        sampler = telemetry.Sampler(ports, hz=float(pp["sample_hz"]),
                                    controller=self.fabric.controller, classes=self.fabric.cpu,
                                    on_queues=self.feed)
        d = Drive(Window(sampler, ports, bridges, name=name))
        watched_hosts = sorted({*ph.hosts, *pp["storage"]["hosts"]})
        procs: list[subprocess.Popen] = []
        gloo_ready: list[Path] = []
        gloo_ranks: list[subprocess.Popen] = []
        servers = False
        try:
            d.leaves0 = self.lossless_start(pp)
            sampler.start()
            if job["library"] == "gloo":
                gloo_ranks, gloo_ready, servers = self.start_gloo_job(ph, procs)
            time.sleep(0.05)
            d.window.open()
            d.ecn0 = self.ecn_counters()
            d.tcp0 = {h: tcp_counters(self.host(h)) for h in watched_hosts}
            clients: list[subprocess.Popen] = []
            storage_ready: list[Path] = []
            if (ph.sconns or ph.lconns) and not servers:
                procs += self.start_storage_servers(pp, work)
            if ph.sconns:
                clients, storage_ready = self.start_storage(pp, ph.sconns, work, estimate)
                procs += clients
            procs += self.start_beside(ph, d, estimate)
            if job["pattern"] == "incast":
                rx = ph.conns[0].spec.dst
                d.capture = ecnwire.start_capture(self.host(rx).popen,
                                                  self.host(rx).defaultIntf().name,
                                                  work / "receiver.pcap")
                self.fabric.record.add_pid(d.capture.pid, "tcpdump at the incast receiver")
                workers = self.start_incast(pp, ph.conns, work)
            elif gloo_ranks:
                workers = gloo_ranks
            elif job["transport"] == "roce":
                workers = self.start_roce_ring(pp, ph.hosts, ph.conns, work)
            else:
                workers = self.start_ring(pp, ph.hosts, ph.conns, work, ph.lconns)
            if storage_ready or gloo_ready:   # every GPU's checkpoints together, with the job
                programs.go(storage_ready + gloo_ready, clients + gloo_ranks)
            procs += [p for p in workers if p not in procs]
            self.progress(self.job_line(name, ph))
            deadline = time.monotonic() + estimate
            lanes = len(ph.hosts) if planning.step_parts_recorded(job) else 0
            with liveview.rank_lanes(work, lanes):
                d.stalls = self.wait_job(ph, workers, deadline)
            d.t_job_end = time.monotonic() - sampler.t0
            if job["pattern"] == "incast" and pp["microburst"]["senders"]:
                d.bursts = self.microbursts(pp, ph.hosts, ph.conns[0].spec.dst, work)
            for p in procs:                      # storage: stop it with the job
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            if d.elephants is not None:          # and the elephants: counted on the switches
                d.elephants.stop()
            for p in procs:
                wait(p, 5)
            remote.fetch(work)                   # what ranks on other workers wrote
            if d.capture is not None:
                d.capture.stop()
            d.window.close()
            d.ecn1 = self.ecn_counters()
            d.tcp1 = {h: tcp_counters(self.host(h)) for h in watched_hosts}
            d.lossless = self.lossless_end(pp, d.leaves0)
        finally:
            self.kill_leftovers(procs, d)
            if self.lossless is not None:
                self.lossless.pfc_off()
            sampler.stop()
        return d

    def wait_job(self, ph: Phase, workers: list[subprocess.Popen], deadline: float
                 ) -> list[str]:
        """Each worker until the deadline, then whatever still runs killed. Returns why a
        hung job hung where the lab can tell (an MPTCP stall), read while it still hangs."""
        for p in workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
        hung = any(p.poll() is None for p in workers)
        stalls = mptcpjob.stalls(self.fabric, ph.pp, ph.hosts) if hung else []
        for p in workers:
            wait(p, 1.0)
        return stalls

    def start_gloo_job(self, ph: Phase, procs: list[subprocess.Popen]
                       ) -> tuple[list[subprocess.Popen], list[Path], bool]:
        """The gloo ranks, before the window: torch's import and the rendezvous are set-up.
        Their connections are watched before it opens, so the switches count the job from
        its first byte; the ranks' own counters start at the go, after it. A DDP rank's
        loader connects to storage before torch is imported (and asks for no batch before
        the go), so its storage servers listen first.

        Each program is added to ``procs`` as it starts, so a failure still stops it.
        Returns the ranks, their ready files and whether the storage servers started."""
        servers = bool(ph.lconns)
        if servers:
            procs += self.start_storage_servers(ph.pp, ph.work)
        mptcpjob.configure(self.fabric, ph.pp, {h: self.ips[h] for h in ph.hosts})
        ranks, ready, reports = self.start_gloo(ph.pp, ph.hosts, ph.work, ph.lconns)
        procs += ranks
        self.gloo_connections(ph, ready, ranks, reports)
        return ranks, ready, servers

    @staticmethod
    def kill_leftovers(procs: list[subprocess.Popen], d: Drive) -> None:
        """Every way out of a phase: what it started and is still running, killed by PID."""
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if d.capture is not None and d.capture.proc.poll() is None:
            d.capture.proc.kill()
        if d.elephants is not None:
            d.elephants.stop()

    def start_beside(self, ph: Phase, d: Drive, estimate: float) -> list[subprocess.Popen]:
        """What runs beside the job, started before it: the elephants (through the job, held
        in ``d`` to be stopped with it), another job's RoCE incast (alone for
        ``incast.alone_s`` first) and the other job's ranks (alone for
        ``other_job.alone_s``); the incast's and the ranks' programs returned."""
        pp, work = ph.pp, ph.work
        if ph.econns:
            d.elephants = FlowRunner(self.fabric, [c.spec for c in ph.econns], work,
                                     self.fabric.record)
            d.elephants.start_servers()
            d.elephants.start_clients(estimate + ELEPHANT_SPARE_S)
            if d.elephants.wait_connected() is None:
                raise MachineError("elephant.pairs", "an elephant did not connect")
        incast = self.start_roce_incast(pp, ph.iconns, work, estimate)
        if not ph.oconns:
            return incast
        (work / "other").mkdir(exist_ok=True)
        others = self.start_ring(otherjob.job_params(pp), pp["other_job"]["hosts"],
                                 ph.oconns, work / "other", [])
        time.sleep(pp["other_job"]["alone_s"])
        return incast + others

    def estimate_s(self, job: dict[str, Any], loader: dict[str, Any]) -> float:
        """How long the job may take before it counts as hung: every step's compute, plus
        its bytes at a quarter of the slowest link's rate, plus a margin; with a loader,
        every batch's preprocessing and bytes as if one worker made them all."""
        slowest = min(self.bw.values())
        batch_s = (loader["cpu_ms"] / 1000 + 4 * loader["batch_bytes"] * 8 / slowest
                   if loader["enabled"] else 0.0)
        return job["steps"] * sum(job["compute_s"] + job["straggler_s"] + 2.0 + batch_s
                                  + 4 * 2 * size * 8 / slowest
                                  for size in job["sizes"] or [job["size_bytes"]]) + 20

    @staticmethod
    def job_line(name: str, ph: Phase) -> str:
        """The progress line a phase's job starts with."""
        job = ph.pp["job"]
        what = (f"{len(job['sizes'])} sizes {job['sizes'][0] / 1e6:g}-"
                f"{job['sizes'][-1] / 1e6:g} MB" if job["sizes"]
                else f"{job['size_bytes'] / 1e6:g} MB")
        return (f"[{name}] {len(ph.hosts)} workers on {', '.join(ph.hosts)}: "
                f"{job['steps']} steps of {job['library']} {job['pattern']} {what}"
                + (" on RoCE" if job["transport"] == "roce" else "")
                + (f" on MPTCP x{job['subflows']}" if job["transport"] == "mptcp" else "")
                + (f", {len(ph.iconns)}-sender RoCE incast beside it" if ph.iconns else "")
                + (f", {len(ph.pinned)} paths placed" if ph.pinned else "")
                + (f", ECN marking {ph.marking}" if ph.marking else ""))

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
        subs = mptcpjob.subflow_conns(self.fabric, ph.pp, {h: self.ips[h] for h in ph.hosts},
                                      conns, self.next_index)
        self.next_index += len(subs)
        ph.conns, ph.subconns = conns, ph.subconns + subs
        ph.pinned = self.set_paths(ph.pp, conns, ph.econns, ph.oconns)
        self.request({"cmd": "watch", "flows": [e for c in conns + subs
                                                for e in c.spec.watch_entries(c.index)]})
