"""GPUs waiting for the network: a synthetic data-parallel job on the fabric, phase by phase.

N "GPU" hosts run ``lab.agents.worker`` workers: compute, then a ring All-Reduce of S bytes
over real TCP, then a barrier, step after step (``job.pattern: ring``); or the
synchronised many-to-one burst of a collective's gather phase (``job.pattern: incast``).
A scenario names the phases to compare on one running fabric (``phases.<name>`` overrides
any key for that phase), e.g. hashed vs placed ring paths, storage traffic sharing the
GPUs' links vs in a class of its own, packed vs scattered placement, tail-drop vs ECN.

Why the numbers can be trusted: a step's time is the workers' own clock (one monotonic
clock for every namespace); a connection's path is the switches' per-flow counters; a
link's bytes, drops and queue are its veth and qdisc counters; CE marks are counted by the
marker and, for incast, on the wire at the receiver. Mechanism: ``lab.kinds.collective.run``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controllers.marking import parse_marking
from lab.agents.ddprank import BLOCKS, SPLIT_BYTES, WIDTH
from lab.kinds.base import Plan
from lab.kinds.collective import beside, mptcpjob, roce
from lab.machine import environment
from lab.measure import queuefeed
from lab.model.errors import MachineError, ScenarioError
from lab.model.flows import PROTO_NUM, FlowSpec
from lab.model.lossless import check_netem
from lab.model.scenario import Param, field_namer, phases_over, with_defaults
from lab.model.topodesc import check_fabric, edge_switches, hosts_of

RING_PORT = 7100          # rank r listens on RING_PORT + r
SINK_PORT = 7300          # the incast receiver
STORAGE_PORT = 7400       # every storage server
BURST_PORT = 7500         # the UDP micro-burst receiver

#: Who moves the ring's bytes: the lab's own ring (``lab.agents.ring``, every 5-tuple fixed
#: in advance) or PyTorch's gloo (``lab.agents.gloorank``, its connections found after
#: rendezvous: ``lab.kinds.collective.gloo``).
LIBRARIES = ("synthetic", "gloo")
#: What the ranks run on the library: one all-reduce of S bytes per step, or a real
#: ``DistributedDataParallel`` training step (``lab.agents.ddprank``: forward, backward with
#: DDP's buckets all-reduced as they become ready, optimizer step) on gloo.
PROGRAMS = ("allreduce", "ddp")
#: Congestion controls whose receiver has a part to play: a DCTCP receiver echoes CE per
#: packet (RFC 8257, section 3.2) instead of RFC 3168's "ECE until CWR". Accepted sockets
#: take their namespace's default, so the job's hosts default to it for the phase (which
#: the kernel allows in a namespace only for a congestion control on its allowed list).
RECEIVER_CC = ("dctcp",)

SCHEMA: dict[str, Param] = {
    # the adaptive policy's congested queue (lab.measure.queuefeed; default half the queue)
    queuefeed.KEY: Param(int, 1),
    "job.pattern": Param(str, choices=("ring", "incast")),
    "job.library": Param(str, choices=LIBRARIES),
    "job.program": Param(str, choices=PROGRAMS),
    "job.bucket_cap_mb": Param(float, 0.001, 1024),
    "job.first_bucket_mb": Param(float, 0.001, 1024),
    "job.workers": Param(int, 2, 64),
    "job.size_bytes": Param(int, 1, 1 << 30),
    # a size sweep (nccl-tests' -b..-e): job.steps steps of each size, in order, one job
    "job.sizes": Param(list),
    "job.steps": Param(int, 1, 10_000),
    "job.warmup": Param(int, 0, 100),
    "job.compute_s": Param(float, 0, 60),
    "job.jitter_s": Param(float, 0, 10),
    "job.buckets": Param(int, 1, 64),
    "job.straggler_rank": Param(int, -1, 63),
    "job.straggler_s": Param(float, 0, 60),
    "job.epoch_steps": Param(int, 0, 10_000),
    "job.cc": Param(str, choices=("cubic", "reno", "bbr", "dctcp")),
    "job.ecn": Param(bool),
    # the ranks' network: the fabric, or the hosts' management NICs (topology.mgmt_bw), as a
    # collective bound to the wrong interface (a wrong NCCL_SOCKET_IFNAME) would be
    "job.interface": Param(str, choices=("fabric", "mgmt")),
    "placement.hosts": Param(str, choices=("packed", "interleaved", "scattered")),
    "placement.paths": Param(str, choices=("hash", "balanced")),
    "placement.receiver": Param(str),
    "storage.mode": Param(str, choices=("off", "shared", "classes")),
    "storage.hosts": Param(list),
    "storage.read_mbps": Param(float, 0, 1000),
    "storage.checkpoint_bytes": Param(int, 1, 1 << 30),
    "storage.every_s": Param(float, 0.1, 600),
    "storage.first_at_s": Param(float, 0, 600),
    # the storage hosts' links (both ends) for the phase, Mbit/s; 0: as the topology built them
    "storage.link_mbps": Param(float, 0, 100_000),
    # the network storage traffic crosses: the compute fabric (shared with the ring), or the
    # hosts' management LAN (topology.mgmt_bw) as a storage network of its own
    "storage.network": Param(str, choices=("fabric", "mgmt")),
    # a ring rank's input pipeline (lab.agents.loader), reading batches from storage.hosts
    # a bool, not a mode: YAML reads a bare on/off as true/false
    "loader.enabled": Param(bool),
    "loader.workers": Param(int, 1, 32),
    "loader.prefetch": Param(int, 1, 64),
    "loader.batch_bytes": Param(int, 1, 1 << 28),
    "loader.cpu_ms": Param(float, 0, 60_000),
    # bulk TCP flows beside the job (lab.kinds.collective.elephant): [source, destination]
    # host pairs, their pacing (0: as fast as TCP goes), and whether each is put on a ring
    # hop's uplink (the collision a per-flow hash makes by chance, made certain)
    "elephant.pairs": Param(list),
    "elephant.mbps": Param(float, 0, 100_000),
    "elephant.collide": Param(bool),
    # another training job beside the phase's (lab.kinds.collective.otherjob): its ranks'
    # hosts in ring order, its all-reduce, how long it runs alone first, whether its hops
    # meet the job's on their uplinks, and whether the controller is told which job is which
    "other_job.hosts": Param(list),
    "other_job.size_bytes": Param(int, 1, 1 << 30),
    "other_job.compute_s": Param(float, 0, 60),
    "other_job.alone_s": Param(float, 0, 60),
    "other_job.collide": Param(bool),
    "other_job.announce": Param(bool),
    # the phase whose job ran alone: this job's slowdown is measured against it
    "other_job.baseline": Param(str),
    "ecn.marking": Param(str, choices=("off", "step", "red")),
    "ecn.k_rule": Param(str, choices=("fixed", "dctcp")),
    "ecn.ports": Param(list),
    "ecn.k_bytes": Param(int, -(1 << 31), 1 << 31),
    "ecn.kmin_bytes": Param(int, -(1 << 31), 1 << 31),
    "ecn.kmax_bytes": Param(int, -(1 << 31), 1 << 31),
    "ecn.pmax": Param(float, -1, 2),
    "microburst.senders": Param(int, 0, 64),
    "microburst.count": Param(int, 1, 10_000),
    "microburst.size": Param(int, 64, 1472),
    "microburst.bursts": Param(int, 1, 100),
    "sample_hz": Param(float, 20, 100),
    **roce.SCHEMA,
    **mptcpjob.SCHEMA,
}

DEFAULTS: dict[str, dict[str, Any]] = {
    "job": {"pattern": "ring", "library": "synthetic", "program": "allreduce",
            # DDP's own defaults: 25 MB buckets, the first one 1 MB
            "bucket_cap_mb": 25.0, "first_bucket_mb": 1.0, "workers": 8, "size_bytes": 1 << 20,
            "sizes": [], "steps": 20, "warmup": 1,
            "compute_s": 0.05, "jitter_s": 0.0, "buckets": 1, "straggler_rank": -1,
            "straggler_s": 0.0, "epoch_steps": 0, "cc": "cubic", "ecn": False,
            "interface": "fabric", "transport": "tcp",
            "subflows": mptcpjob.DEFAULT_SUBFLOWS},
    "placement": {"hosts": "packed", "paths": "hash", "receiver": ""},
    "storage": {"mode": "off", "hosts": [], "read_mbps": 1.0, "checkpoint_bytes": 2 << 20,
                "every_s": 2.5, "first_at_s": 1.0, "link_mbps": 0.0,
                "network": "fabric"},
    # PyTorch's DataLoader defaults where it has them (prefetch_factor 2); off: no input wait
    "loader": {"enabled": False, "workers": 2, "prefetch": 2, "batch_bytes": 256 * 1024,
               "cpu_ms": 0.0},
    "elephant": {"pairs": [], "mbps": 0.0, "collide": True},
    "other_job": {"hosts": [], "size_bytes": 300_000, "compute_s": 0.1, "alone_s": 2.0,
                  "collide": True, "announce": False, "baseline": ""},
    # k_rule "fixed": step at k_bytes; "dctcp": step at the K DCTCP's guidance gives for the
    # marked port's rate and the job's measured RTT (controllers.marking.dctcp_k_bytes).
    "ecn": {"marking": "off", "ports": [], "k_bytes": 30_000, "kmin_bytes": 20_000,
            "kmax_bytes": 80_000, "pmax": 0.2, "k_rule": "fixed"},
    "microburst": {"senders": 0, "count": 60, "size": 1000, "bursts": 3},
    **roce.DEFAULTS,
}


def merged(params: dict[str, Any]) -> dict[str, Any]:
    """The scenario's values over the defaults, section by section (phases excluded)."""
    out = with_defaults(params, DEFAULTS)
    out.setdefault("sample_hz", 25.0)
    return out


def phase_params(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{phase name: its full parameters}, in the scenario's order (one phase if none)."""
    return phases_over(merged(params), params)


# -- checks: everything a phase needs, before anything starts ----------------------------

def fabric_port_names(topo_desc: dict[str, Any]) -> set[str]:
    switches = {s["name"] for s in topo_desc["switches"]}
    return {f"{n}-eth{p}" for ln in topo_desc["links"]
            for n, p in ((ln["a"], ln["a_port"]), (ln["b"], ln["b_port"])) if n in switches}


def check_marking(ecn: dict[str, Any], where: str) -> dict[str, Any] | None:
    """The marker's request body for a phase, or None when marking is off."""
    if ecn["marking"] == "off":
        return None
    if ecn["marking"] == "step":
        body = {"k_bytes": ecn["k_bytes"]}
    else:
        body = {"kmin_bytes": ecn["kmin_bytes"], "kmax_bytes": ecn["kmax_bytes"],
                "pmax": ecn["pmax"]}
    try:
        parse_marking(body, where)
    except ValueError as exc:
        field, _, why = str(exc).partition(": ")
        raise ScenarioError(field, why or str(exc)) from None
    return body


def check_phase(name: str, pp: dict[str, Any], topo_desc: dict[str, Any],
                over: dict[str, Any] | None = None, lossless: bool = False) -> None:
    """One phase's settings on this topology; ``lossless``: whether the run lays the
    lossless class on the ports (some phase has RoCE traffic)."""
    job = pp["job"]
    f = field_namer(name, over or {})
    n = job["workers"]
    if job["program"] == "ddp":
        check_ddp(job, f)
    if job["library"] == "gloo":
        check_gloo(job, f)
    elif job["pattern"] == "ring" and job["size_bytes"] % (n * job["buckets"]):
        raise ScenarioError(f("job.size_bytes"), f"{job['size_bytes']} bytes do not split "
                            f"into {n} ranks x {job['buckets']} buckets of whole chunks "
                            f"(make it a multiple of {n * job['buckets']})")
    check_sizes(job, f)
    if job["straggler_rank"] >= n:
        raise ScenarioError(f("job.straggler_rank"), f"rank {job['straggler_rank']} does "
                            f"not exist in a job of {n} workers")
    hosts = {h["name"] for h in topo_desc["hosts"]}
    for h in pp["storage"]["hosts"]:
        if not isinstance(h, str) or h not in hosts:
            raise ScenarioError(f("storage.hosts"), f"no host {h!r} in the topology")
    if pp["storage"]["mode"] != "off" and not pp["storage"]["hosts"]:
        raise ScenarioError(f("storage.hosts"), "storage traffic needs at least one host")
    if pp["storage"]["link_mbps"] and not pp["storage"]["hosts"]:
        raise ScenarioError(f("storage.link_mbps"), "sets the storage hosts' links; name "
                            "them in storage.hosts")
    check_loader(pp, f)
    check_storage_network(pp, topo_desc, f)
    known = None if pp["placement"]["hosts"] == "scattered" \
        else place_workers(topo_desc, pp, random.Random(0))
    beside.check_elephants(pp, topo_desc, known, f)
    beside.check_other_job(pp, topo_desc, known, f)
    roce.check(pp, topo_desc, known, lossless, f)
    mptcpjob.check(pp, f)
    if job["interface"] == "mgmt":
        if not topo_desc.get("mgmt"):
            raise ScenarioError(f("job.interface"), "this topology has no management network "
                                "(set topology.mgmt_bw)")
        if job["library"] != "synthetic" or job["pattern"] != "ring":
            raise ScenarioError(f("job.interface"), "the lab binds the synthetic ring's "
                                "ranks to an interface, not "
                                f"{job['library']} {job['pattern']}")
    free = sum(len(hs) for hs in candidate_hosts(topo_desc, pp).values())
    if n > free:
        raise ScenarioError(f("job.workers"), f"{n} workers need {n} hosts; the topology "
                            f"has {free} that are not storage")
    rx = pp["placement"]["receiver"]
    if rx and rx not in hosts:
        raise ScenarioError(f("placement.receiver"), f"no host {rx!r} in the topology")
    if pp["placement"]["paths"] == "balanced" and topo_desc["type"] != "leafspine":
        raise ScenarioError(f("placement.paths"), "balanced placement is implemented for "
                            "leafspine topologies")
    ports = fabric_port_names(topo_desc)
    for p in pp["ecn"]["ports"]:
        if not isinstance(p, str) or p not in ports:
            raise ScenarioError(f("ecn.ports"), f"no switch port {p!r} in this topology "
                                f"(ports are named like {sorted(ports)[0]})")
    thresholds = ("k_bytes", "kmin_bytes", "kmax_bytes", "pmax")
    where = next((f(f"ecn.{k}").removesuffix(f".{k}") for k in thresholds
                  if f(f"ecn.{k}") != f"ecn.{k}"), "ecn")
    for marking in ("step", "red"):       # thresholds are checked even when not in use
        check_marking({**pp["ecn"], "marking": marking}, where)
    # on a lossless fabric, as DCQCN deployments do, no port named marks every switch port
    if check_marking(pp["ecn"], where) is not None and not pp["ecn"]["ports"] \
            and not roce.uses_lossless(pp):
        raise ScenarioError(f("ecn.ports"), "marking is on but no port is named")
    if pp["ecn"]["k_rule"] == "dctcp" and pp["ecn"]["marking"] != "step":
        raise ScenarioError(f("ecn.k_rule"), "DCTCP's rule gives a step threshold K; it "
                            f"needs ecn.marking: step, not {pp['ecn']['marking']!r}")
    if pp["microburst"]["senders"] and job["pattern"] != "incast":
        raise ScenarioError(f("microburst.senders"), "micro-bursts go to the incast "
                            "receiver; set job.pattern: incast")
    if pp["microburst"]["senders"] > n - 1:
        raise ScenarioError(f("microburst.senders"), f"at most {n - 1} (the job's senders)")


#: The (library, program) of ring jobs whose ranks run a training step that records its
#: parts (and can wait for a data loader's batches): the lab's own ring
#: (``lab.agents.ring``) and DDP's (``lab.agents.ddprank``). gloo's bare all-reduce has no
#: training step, the incast no rank at all.
LOADER_JOBS = (("synthetic", "allreduce"), ("gloo", "ddp"))


def step_parts_recorded(job: dict[str, Any]) -> bool:
    """Whether the job's ranks run a training step with parts (``LOADER_JOBS``): those can
    have a data loader, and write their parts for a live view."""
    return job["pattern"] == "ring" and (job["library"], job["program"]) in LOADER_JOBS


def check_loader(pp: dict[str, Any], f: Any) -> None:
    """A data loader reads from the storage hosts, into a training rank that waits for its
    batches: the synthetic ring's or DDP's (``LOADER_JOBS``)."""
    if not pp["loader"]["enabled"]:
        return
    job = pp["job"]
    if not step_parts_recorded(job):
        what = ("the incast" if job["pattern"] != "ring"
                else f"job.library {job['library']} with job.program {job['program']}")
        raise ScenarioError(f("loader.enabled"), "the data loader feeds the synthetic "
                            "ring's ranks (job.library: synthetic) or DDP's (job.library: "
                            f"gloo, job.program: ddp), not {what}")
    if not pp["storage"]["hosts"]:
        raise ScenarioError(f("storage.hosts"), "the data loader reads its batches from "
                            "storage hosts; name at least one")


def check_storage_network(pp: dict[str, Any], topo_desc: dict[str, Any], f: Any) -> None:
    """A storage network of its own is the management LAN, and it carries the loaders'
    batches: without that LAN or without a loader there is nothing to put on it; NIC classes
    share a GPU's fabric NIC between the ring and storage, which a separate network does
    not."""
    st = pp["storage"]
    if st["network"] != "mgmt":
        return
    if not topo_desc.get("mgmt"):
        raise ScenarioError(f("storage.network"), "this topology has no management network "
                            "(set topology.mgmt_bw)")
    if not pp["loader"]["enabled"]:
        raise ScenarioError(f("storage.network"), "a separate storage network carries the "
                            "data loaders' batches; this phase has no loader "
                            "(loader.enabled: true)")
    if st["mode"] == "classes":
        raise ScenarioError(f("storage.network"), "storage.mode classes shares the GPUs' "
                            "fabric NICs between the ring and storage; on a separate storage "
                            "network there is nothing to share")


def check_sizes(job: dict[str, Any], f: Any) -> None:
    """A sweep's sizes: whole numbers the job's library can split, one bucket, no epochs."""
    sizes = job["sizes"]
    if not sizes:
        return
    n = job["workers"]
    multiple, what = ((4, "whole float32 elements for gloo") if job["library"] == "gloo"
                      else (n, f"split into {n} equal ring chunks"))
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= 1 << 30:
            raise ScenarioError(f("job.sizes"), f"expected sizes in bytes (1..{1 << 30}), "
                                f"got {size!r}")
        if size % multiple:
            raise ScenarioError(f("job.sizes"), f"{size} bytes do not {what} (make it a "
                                f"multiple of {multiple})")
    if job["pattern"] != "ring" or job["buckets"] != 1 or job["epoch_steps"]:
        raise ScenarioError(f("job.sizes"), "a size sweep is a ring All-Reduce of one "
                            "bucket on connections it keeps (job.pattern: ring, buckets: 1, "
                            "epoch_steps: 0)")


def check_gloo(job: dict[str, Any], f: Any) -> None:
    """What the gloo job cannot do: the incast (the lab's own pattern, no library call),
    overlapped buckets (one all_reduce per step), a size that is not whole float32s."""
    if job["pattern"] != "ring":
        raise ScenarioError(f("job.library"), "gloo runs the All-Reduce (job.pattern: ring); "
                            "the incast is the lab's own pattern")
    if job["size_bytes"] % 4:
        raise ScenarioError(f("job.size_bytes"), f"{job['size_bytes']} bytes are not whole "
                            "float32 elements for gloo (make it a multiple of 4)")
    if job["buckets"] != 1:
        raise ScenarioError(f("job.buckets"), "gloo runs one all_reduce per step here; "
                            "buckets must be 1")


def check_ddp(job: dict[str, Any], f: Any) -> None:
    """What a DDP job needs: gloo under it, a gradient size its model can be built to, one
    step shape (no size sweep)."""
    if job["library"] != "gloo":
        raise ScenarioError(f("job.library"), "DDP runs on PyTorch's gloo (job.library: "
                            f"gloo), not {job['library']!r}")
    if job["size_bytes"] % SPLIT_BYTES:
        raise ScenarioError(f("job.size_bytes"), f"{job['size_bytes']} bytes do not split "
                            f"into the model's {BLOCKS} blocks of float32 matrices {WIDTH} "
                            f"wide (make it a multiple of {SPLIT_BYTES})")
    if job["sizes"]:
        raise ScenarioError(f("job.sizes"), "a size sweep all-reduces bare tensors "
                            "(job.program: allreduce); a DDP model has one gradient size")


def uses_gloo(phases: dict[str, dict[str, Any]]) -> list[str]:
    """The phases whose job runs on gloo."""
    return [n for n, pp in phases.items() if pp["job"]["library"] == "gloo"]


def phases_to_skip(params: dict[str, Any], phases: dict[str, dict[str, Any]],
                   congestion_controls: list[str]) -> dict[str, str]:
    """{phase: why it is skipped} for phases whose own ``job.cc`` this kernel lacks.

    A phase that asks for a congestion control of its own (``phases.<name>.job.cc``, e.g. a
    DCTCP phase next to cubic ones) is an extra where the kernel has it; the others still
    compare. A congestion control the scenario itself asks for, or one that leaves no phase
    to run, is an error (MachineError naming job.cc), not a skip.
    """
    raw = params.get("phases") or {}
    have = ", ".join(congestion_controls)
    skip: dict[str, str] = {}
    for name, pp in phases.items():
        cc = pp["job"]["cc"]
        if cc in congestion_controls:
            continue
        own = ((raw.get(name) or {}).get("job") or {}).get("cc")
        if own is None:
            raise MachineError("job.cc", f"{cc} is not in this kernel (it has: {have}); "
                               f"phase {name}")
        skip[name] = f"skipped: this kernel has no {cc} (it has: {have})"
    if skip and len(skip) == len(phases):
        first = next(iter(skip))
        raise MachineError(f"phases.{first}.job.cc", f"{phases[first]['job']['cc']} is not "
                           f"in this kernel (it has: {have}) and no phase is left to run")
    return skip


def check(params: dict[str, Any], topo_desc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    check_fabric(topo_desc, "collective")
    phases = phase_params(params)
    raw = params.get("phases") or {}
    lossless = any(map(roce.uses_lossless, phases.values()))
    if lossless:
        check_netem(topo_desc, "a collective on RoCE")
    for name, pp in phases.items():
        check_phase(name, pp, topo_desc, raw.get(name) or {}, lossless)
        f = field_namer(name, raw.get(name) or {})
        if pp["other_job"]["announce"]:
            beside.check_job_aware(str(params.get("policy", "")), f("other_job.announce"))
        base = pp["other_job"]["baseline"]
        if base and (base not in phases or phases[base]["other_job"]["hosts"]):
            raise ScenarioError(f("other_job.baseline"), f"{base!r} is not a phase of this "
                                "scenario whose job runs alone")
    return phases


# -- placement ------------------------------------------------------------------------------

def candidate_hosts(topo_desc: dict[str, Any], pp: dict[str, Any]) -> dict[str, list[str]]:
    """{edge switch: its hosts that may run a worker}, storage hosts excluded."""
    storage = set(pp["storage"]["hosts"])
    return {sw: [h for h in hosts_of(topo_desc, sw) if h not in storage]
            for sw in edge_switches(topo_desc)}


def place_workers(topo_desc: dict[str, Any], pp: dict[str, Any],
                  rng: random.Random) -> list[str]:
    """Hosts of ranks 0..N-1.

    ``packed`` fills one rack after another (what a topology-aware scheduler does);
    ``interleaved`` alternates racks so that every ring hop crosses the spines (the worst
    case for ECMP, and the one the lesson wants); ``scattered`` is a topology-blind
    scheduler: any free hosts, in any order.
    """
    n = pp["job"]["workers"]
    racks = [hs for hs in candidate_hosts(topo_desc, pp).values() if hs]
    mode = pp["placement"]["hosts"]
    if mode == "packed":
        order = [h for hs in racks for h in hs]
    elif mode == "interleaved":
        order = [rack[i] for i in range(max(map(len, racks))) for rack in racks if i < len(rack)]
    else:
        order = [h for hs in racks for h in hs]
        rng.shuffle(order)
    return order[:n]


@dataclass
class Conn:
    """One TCP connection of the job (or of storage), 5-tuple known before it starts."""

    spec: FlowSpec
    rank: int
    epoch: int
    index: int = 0        # run-wide: picks the connection's counter cookies


def epochs(job: dict[str, Any]) -> int:
    e = job["epoch_steps"]
    return 1 if e <= 0 else -(-job["steps"] // e)


def ring_conns(hosts: list[str], ips: dict[str, str], job: dict[str, Any],
               sports: list[int], next_id: int) -> list[Conn]:
    """Rank r -> rank r+1, one connection per epoch, source ports drawn for the run."""
    n = len(hosts)
    out = []
    for e in range(epochs(job)):
        for r in range(n):
            src, dst = hosts[r], hosts[(r + 1) % n]
            spec = FlowSpec(id=f"r{r}e{e}", src=src, dst=dst, src_ip=ips[src],
                            dst_ip=ips[dst], proto="tcp", sport=sports.pop(),
                            dport=RING_PORT + (r + 1) % n, rate_bps=0.0, kind="allreduce",
                            cc=job["cc"])
            out.append(Conn(spec, r, e, next_id + len(out)))
    return out


def uplink_ports(topo_desc: dict[str, Any]) -> dict[tuple[str, str], int]:
    """{(leaf, spine): the leaf's port towards that spine}."""
    roles = {s["name"]: s["role"] for s in topo_desc["switches"]}
    out = {}
    for ln in topo_desc["links"]:
        if roles.get(ln["a"]) == "leaf" and roles.get(ln["b"]) == "spine":
            out[(ln["a"], ln["b"])] = ln["a_port"]
    return out


def balanced_pins(conns: list[Conn], leaf_of: dict[str, str],
                  up: dict[tuple[str, str], int]) -> list[dict[str, Any]]:
    """A collision-free placement of each epoch's cross-rack connections on the spines.

    Greedy: each connection takes the spine least used by its source leaf's uplinks and its
    destination leaf's downlinks so far; with at least as many spines as connections per
    leaf (the non-blocking case), no two share a link. Only the data direction is pinned:
    the ACKs are a few per cent of the bytes.
    """
    spines = sorted({s for (_, s) in up}, key=lambda s: int(s[5:]))
    pins = []
    for e in sorted({c.epoch for c in conns}):
        load_up: dict[tuple[str, str], int] = {}
        load_down: dict[tuple[str, str], int] = {}
        for c in (c for c in conns if c.epoch == e):
            a, b = leaf_of[c.spec.src], leaf_of[c.spec.dst]
            if a == b:
                continue
            spine = min(spines, key=lambda s, a=a, b=b: (
                max(load_up.get((a, s), 0), load_down.get((b, s), 0)),
                load_up.get((a, s), 0) + load_down.get((b, s), 0)))
            load_up[(a, spine)] = load_up.get((a, spine), 0) + 1
            load_down[(b, spine)] = load_down.get((b, spine), 0) + 1
            f = c.spec
            pins.append({"switch": a, "port": up[(a, spine)], "proto": PROTO_NUM[f.proto],
                         "src": f.src_ip,
                         "dst": f.dst_ip, "sport": f.sport, "dport": f.dport})
    return pins


def flows(topo_desc: dict[str, Any], params: dict[str, Any],
          rng: random.Random) -> list[FlowSpec]:
    """Checks every phase; the connections themselves are planned per phase when it runs."""
    check(params, topo_desc)
    queuefeed.threshold(params, topo_desc)
    return []


def read_proc(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def cluster_refusal(plan: Plan) -> tuple[str, str] | None:
    """Why a phase cannot run split over machines yet (the field, the reason), or None.

    A synthetic ring's ranks run on any worker: their outputs come back to the head and
    their times are stamped on its clock (``lab.machine.programs.spawn``). Gloo's ranks and
    the storage clients are told to go through ready files, and the incast receiver's
    capture is a file, all read where the head is; not yet across machines.
    """
    for name, pp in check(plan.params, plan.topo_desc).items():
        for field, value, runs in (("job.library", pp["job"]["library"], "synthetic"),
                                   ("job.pattern", pp["job"]["pattern"], "ring"),
                                   ("storage.mode", pp["storage"]["mode"], "off"),
                                   ("loader.enabled", pp["loader"]["enabled"], False)):
            if value != runs:
                return (field, f"{value} (phase {name}): a cluster runs {field} {runs} so "
                        "far; its programs' ready files and captures are read on the head")
    return None


def prepare(plan: Plan) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Every phase's parameters, and the phases this machine cannot run (and why); refuses
    a congestion control or a marking the machine cannot give, before anything starts."""
    phases_pp = check(plan.params, plan.topo_desc)
    skipped = phases_to_skip(plan.params, phases_pp, plan.env.congestion_controls)
    phases_pp = {n: pp for n, pp in phases_pp.items() if n not in skipped}
    if any(map(roce.uses_lossless, phases_pp.values())):
        roce.build()
    gloo_phases = uses_gloo(phases_pp)
    if gloo_phases:
        lib = environment.collective_library()
        if not lib["torch"]:
            raise MachineError("job.library", f"gloo needs PyTorch: {environment.TORCH_MISSING}"
                               f" (phase {gloo_phases[0]})")
        if not lib["gloo"]:
            raise MachineError("job.library", f"PyTorch {lib['torch']} has no gloo backend "
                               f"(phase {gloo_phases[0]})")
    for name, pp in phases_pp.items():
        if pp["job"]["cc"] in RECEIVER_CC:
            allowed = read_proc("/proc/sys/net/ipv4/tcp_allowed_congestion_control").split()
            if pp["job"]["cc"] not in allowed:
                raise MachineError("job.cc", f"{pp['job']['cc']} is in this kernel but not "
                                   "allowed in network namespaces (net.ipv4.tcp_allowed_"
                                   "congestion_control; `make setup` allows every available "
                                   f"one); phase {name}")
        if check_marking(pp["ecn"], "ecn") and plan.env.ecn == "none":
            raise MachineError("ecn.marking", "this machine has no ECN marking mechanism "
                               "(RED, or clang and bpftool for the tc-BPF marker)")
    return phases_pp, skipped
