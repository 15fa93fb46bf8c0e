"""How a collective phase is set up on the running fabric, before its programs start: the
workers placed, every connection's 5-tuple planned, the paths pinned or handed back to the
policy, ECN marking (with DCTCP's K from the measured RTT), the hosts' congestion control
and ECN, and every connection watched on every switch.

``JobSetup`` is the part of ``lab.kinds.collective.run.JobRun`` that does this; it reads
the run's fabric, addresses and source ports, which ``JobRun`` holds.
"""

from __future__ import annotations

import copy
import random
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controllers.marking import dctcp_k_bytes
from lab.kinds.base import Plan
from lab.kinds.collective import elephant, otherjob, roce
from lab.kinds.collective import plan as planning
from lab.kinds.collective.plan import RECEIVER_CC, Conn
from lab.measure import telemetry
from lab.model.errors import MachineError
from lab.model.flows import FlowSpec

#: Pings per sender when the base RTT is measured for DCTCP's K: the smallest of these is
#: the RTT without queueing.
RTT_PINGS = 10


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


@dataclass
class Phase:
    """A phase's settings on the fabric: placed workers, planned connections (the job's,
    storage's, the data loaders'), paths pinned, the marking and the DCTCP K rule it was
    given."""

    pp: dict[str, Any]
    work: Path
    hosts: list[str]
    conns: list[Conn]
    sconns: list[Conn]
    pinned: list[dict[str, Any]]
    marking: dict[str, Any] | None
    k_rule: dict[str, Any] | None
    lconns: list[Conn] = field(default_factory=list)
    econns: list[Conn] = field(default_factory=list)
    oconns: list[Conn] = field(default_factory=list)
    iconns: list[Conn] = field(default_factory=list)    # another job's RoCE incast
    #: The sprayed QPs' other 5-tuples (``roce.spray``), each watched as a flow.
    subconns: list[Conn] = field(default_factory=list)

    def all_conns(self) -> list[Conn]:
        """Every connection the phase watches on the switches, in its flows' order."""
        return (self.conns + self.sconns + self.lconns + self.econns + self.oconns
                + self.iconns + self.subconns)


class JobSetup:
    """A phase's network settings on the running fabric (a part of ``JobRun``)."""

    plan: Plan
    topo: dict[str, Any]
    rng: random.Random
    sports: list[int]
    ips: dict[str, str]
    leaf_of: dict[str, str]
    ports: list[telemetry.Port]
    marked: set[str]
    default_cc: dict[str, str]
    next_index: int
    work: Path
    #: Whether the controller holds a jobs table from an earlier phase.
    announced: bool = False

    host: Callable[[str], Any]                          # JobPrograms': a fabric host
    roce_ring_conns: Callable[[dict[str, Any], list[str]], list[Conn]]   # RoceJob's
    incast_conns: Callable[[dict[str, Any]], list[Conn]]                 # RoceJob's
    spray_conns: Callable[[dict[str, Any], list[Conn]], list[Conn]]      # RoceJob's
    warm_sprayed: Callable[[dict[str, Any], list[Conn]], None]           # RoceJob's
    request: Callable[[dict[str, Any]], dict[str, Any]]  # JobRun's: the controller's answer

    # -- planning -----------------------------------------------------------------------------
    def network_ips(self, network: str) -> dict[str, str]:
        """{host: its address on ``network``}: the fabric's, or the management LAN's."""
        if network == "mgmt":
            return {h["name"]: h["ip"] for h in self.topo["mgmt"]["hosts"]}
        return self.ips

    def job_ips(self, pp: dict[str, Any]) -> dict[str, str]:
        """{host: the address its ranks use}: the fabric's, or with ``job.interface: mgmt``
        the management network's (a collective bound to the wrong NIC)."""
        return self.network_ips(pp["job"]["interface"])

    def storage_ips(self, pp: dict[str, Any]) -> dict[str, str]:
        """{host: the address its storage traffic uses, at both ends}: the fabric's, or with
        ``storage.network: mgmt`` the management LAN's, a storage network of its own."""
        return self.network_ips(pp["storage"]["network"])

    def conns_for(self, pp: dict[str, Any], hosts: list[str]) -> list[Conn]:
        job = pp["job"]
        if job["library"] == "gloo":
            return []                   # gloo numbers its own: found after rendezvous
        if job["transport"] == "roce":
            return self.roce_ring_conns(pp, hosts)
        if job["pattern"] == "ring":
            conns = planning.ring_conns(hosts, self.job_ips(pp), job, self.sports,
                                        self.next_index)
        else:
            rx = self.receiver(pp, hosts)
            conns = []
            for i, h in enumerate(x for x in hosts if x != rx):
                spec = FlowSpec(id=f"s{i + 1}", src=h, dst=rx, src_ip=self.ips[h],
                                dst_ip=self.ips[rx], proto="tcp", sport=self.sports.pop(),
                                dport=planning.SINK_PORT, rate_bps=0.0, kind="incast",
                                cc=job["cc"])
                conns.append(Conn(spec, i + 1, 0, self.next_index + i))
        self.next_index += len(conns)
        return conns

    def storage_conns(self, pp: dict[str, Any], hosts: list[str]) -> list[Conn]:
        st = pp["storage"]
        if st["mode"] == "off":
            return []
        ips = self.storage_ips(pp)
        conns = []
        for r, h in enumerate(hosts):
            srv = st["hosts"][r % len(st["hosts"])]
            for what in ("read", "checkpoint"):
                src, dst = (srv, h) if what == "read" else (h, srv)
                sport = self.sports.pop()
                # A read flows from the server; its 5-tuple is the client's connection seen
                # from the server's side.
                spec = FlowSpec(id=f"{what}{r}", src=src, dst=dst, src_ip=ips[src],
                                dst_ip=ips[dst], proto="tcp",
                                sport=planning.STORAGE_PORT if what == "read" else sport,
                                dport=sport if what == "read" else planning.STORAGE_PORT,
                                rate_bps=st["read_mbps"] * 1e6 if what == "read" else 0.0,
                                kind=f"storage-{what}", cc=pp["job"]["cc"])
                conns.append(Conn(spec, r, 0, self.next_index))
                self.next_index += 1
        return conns

    def loader_conns(self, pp: dict[str, Any], hosts: list[str]) -> list[Conn]:
        """Each rank's loader workers' storage connections, one per worker, with a source
        port of its own: worker i of rank r reads from storage host (r + i) mod S, so the
        ranks' first workers do not all queue on the first storage host.

        The batches flow from the server, so a connection's spec is seen from the server's
        side (as a storage read's is); a rank's connections are in its workers' order.
        Its congestion control is the server's: an accepted socket takes its namespace's
        default, which is not the job's, so the spec names none rather than a wrong one.
        Both ends' addresses are the storage network's (``storage_ips``).
        """
        ld, st = pp["loader"], pp["storage"]
        if not ld["enabled"]:
            return []
        ips = self.storage_ips(pp)
        conns = []
        for r, h in enumerate(hosts):
            for i in range(ld["workers"]):
                srv = st["hosts"][(r + i) % len(st["hosts"])]
                spec = FlowSpec(id=f"load{r}w{i}", src=srv, dst=h, src_ip=ips[srv],
                                dst_ip=ips[h], proto="tcp", sport=planning.STORAGE_PORT,
                                dport=self.sports.pop(), rate_bps=0.0, kind="loader")
                conns.append(Conn(spec, r, 0, self.next_index))
                self.next_index += 1
        return conns

    @staticmethod
    def receiver(pp: dict[str, Any], hosts: list[str]) -> str:
        return pp["placement"]["receiver"] or hosts[0]

    # -- controller: paths and marking ----------------------------------------------------------
    def set_paths(self, pp: dict[str, Any], conns: list[Conn], econns: list[Conn],
                  oconns: list[Conn]) -> list[dict[str, Any]]:
        """Pin the job's connections (``balanced``) or hand them back to the policy; pin
        colliding elephants and another job's hops onto a ring hop's uplink (``collide``)."""
        pins: list[dict[str, Any]] = []
        up = planning.uplink_ports(self.topo)
        if pp["placement"]["paths"] == "balanced":
            pins = planning.balanced_pins([c for c in conns if c.spec.kind == "allreduce"],
                                      self.leaf_of, up)
        if econns and pp["elephant"]["collide"]:
            pins += elephant.collision_pins(econns, conns, self.leaf_of, up, pins)
        if oconns and pp["other_job"]["collide"]:
            pins += elephant.collision_pins(oconns, conns, self.leaf_of, up, pins,
                                            required=False)
        self.request({"cmd": "pin", "flows": pins})
        return pins

    def announce_jobs(self, pp: dict[str, Any], conns: list[Conn],
                      oconns: list[Conn]) -> None:
        """Tell a job-aware policy which job each connection is (``other_job.announce``),
        before the connections are watched (a decision taken ahead must see it); a phase
        that does not announce clears what an earlier one said."""
        if pp["other_job"]["announce"]:
            self.request({"cmd": "jobs", "flows": otherjob.announced(conns, oconns)})
            self.announced = True
        elif self.announced:
            self.request({"cmd": "jobs", "flows": []})
            self.announced = False

    def set_marking(self, pp: dict[str, Any], where: str) -> dict[str, Any] | None:
        """The phase's marking on its ports: those named, or on a lossless fabric with
        none named every switch port (``lab.kinds.collective.plan.check_phase``)."""
        body = planning.check_marking(pp["ecn"], where)
        named = pp["ecn"]["ports"] or ([p.intf for p in self.ports]
                                       if roce.uses_lossless(pp) else [])
        ports = set(named) if body else set()
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

    def configure(self, name: str, pp: dict[str, Any]) -> Phase:
        """Place the workers, plan their connections, and set the phase's paths, marking,
        congestion control and ECN on the hosts; the switches count every connection."""
        work = self.work / name
        work.mkdir(parents=True, exist_ok=True)
        where = "ecn" if name == "run" else f"phases.{name}.ecn"
        hosts = planning.place_workers(self.topo, pp, self.rng)
        conns = self.conns_for(pp, hosts)
        sconns = self.storage_conns(pp, hosts)
        lconns = self.loader_conns(pp, hosts)
        econns = elephant.conns(pp, self.ips, self.sports, self.next_index)
        self.next_index += len(econns)
        oconns = otherjob.conns(pp, self.ips, self.sports, self.next_index)
        self.next_index += len(oconns)
        iconns = self.incast_conns(pp)
        qps = (conns if pp["job"]["transport"] == "roce" else []) + iconns
        subconns = self.spray_conns(pp, qps)
        pinned = self.set_paths(pp, conns, econns, oconns)
        self.announce_jobs(pp, conns, oconns)
        k_rule = None
        if pp["ecn"]["k_rule"] == "dctcp" and pp["ecn"]["marking"] == "step":
            pp, k_rule = self.dctcp_k(pp, conns)
        marking = self.set_marking(pp, where)
        self.set_default_cc(pp, hosts)
        ecn_flag = 1 if pp["job"]["ecn"] else 0
        for h in {*hosts, *pp["storage"]["hosts"], *pp["other_job"]["hosts"]}:
            self.host(h).cmd(f"sysctl -qw net.ipv4.tcp_ecn={ecn_flag}")
        ph = Phase(pp, work, hosts, conns, sconns, pinned, marking, k_rule, lconns, econns,
                   oconns, iconns, subconns)
        self.request({"cmd": "watch", "flows": [e for c in ph.all_conns()
                                                for e in c.spec.watch_entries(c.index)]})
        self.warm_sprayed(pp, qps)
        return ph
