"""Bring an emulated fabric up and down: Mininet hosts and links, OVS switches, the controller.

Order matters and is fixed here: refuse names that already exist (Mininet would otherwise
delete a same-named bridge of somebody else's), write down what will be created, start the
controller, then build the network and start the switches, then wait until the controller
says every switch is programmed. Teardown removes exactly what the record lists.
"""

from __future__ import annotations

import subprocess
import time
from functools import partial
from pathlib import Path

from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.node import OVSBridge, OVSSwitch, RemoteController

from controllers import config
from lab.machine import cpuclass, state
from lab.machine.environment import Environment
from lab.model.errors import MachineError
from lab.model.flows import EPHEMERAL_SYSCTL, HOST_EPHEMERAL_PORTS
from lab.net.cluster import ClusterRun, LabRemoteSwitch
from lab.net.controller import Controller
from lab.net.links import (
    HOST_TCP_SYSCTLS,
    TSO_LIMIT,
    TSO_LIMIT_CLUSTER,
    ShapedIntf,
    ShapedLink,
    ShapingBatch,
)
from lab.net.reach import ping_all
from lab.net.topobase import FabricTopo, planned_names
from lab.net.topologies import describe

#: Compiled BPF objects (the ECN marker), built on first use and kept across runs: they
#: depend only on the source, and building takes a second of clang.
BPF_BUILD_DIR = state.STATE_DIR / "bpf"


class LabControllerRef(RemoteController):
    """Mininet's handle on the lab's controller; skips Mininet's telnet probe of the port
    (the lab already knows the controller is up: it asked over the control socket)."""

    def checkListening(self) -> None:  # noqa: N802 - Mininet API name
        return


def lab_switch(opts: dict[str, object], mgmt: frozenset[str], name: str,
               **params: object) -> OVSSwitch:
    """One of the topology's switches, as Mininet asks for it by name.

    A fabric switch is fail-secure and programmed by the controller. A management switch
    (``FabricTopo.add_mgmt_network``) is an ``OVSBridge``: no controller, fail mode
    standalone, so OVS forwards with its own MAC learning (the NORMAL action) like a plain
    LAN switch, and the fabric's ECMP logic never sees it. Both run in the same
    ovs-vswitchd and datapath, so the lab records and removes their bridges alike.
    """
    cls = OVSBridge if name in mgmt else OVSSwitch
    return cls(name, **{**opts, **params})


class Fabric:
    """A running network: ``start()`` brings it up, ``stop()`` removes what it created."""

    def __init__(self, topo: FabricTopo, env: Environment, runtime: str, policy: str,
                 seed: int, run_dir: Path, record: state.RunRecord,
                 cluster: ClusterRun | None = None) -> None:
        self.topo = topo
        self.desc = describe(topo)
        self.env = env
        self.runtime = runtime
        self.policy = policy
        self.seed = seed
        self.run_dir = run_dir
        self.record = record
        #: The CPU classes of what the run starts in hosts: below the datapath.
        self.cpu = cpuclass.CpuClasses(record.run_id, record)
        self.net: Mininet | None = None
        self.controller: Controller | None = None
        self.timings: dict[str, float] = {}
        #: Hosts that route for off-fabric addresses (set before ``start``).
        self.gateways: frozenset[str] = frozenset()
        #: The other machines this fabric is split over (``lab.net.cluster``), if any.
        self.cluster = cluster

    # -- bring-up ---------------------------------------------------------------------------
    @staticmethod
    def check_free(bridges: list[str], intfs: list[str]) -> None:
        taken = sorted(set(bridges) & state.existing_bridges())
        taken += sorted(set(intfs) & state.existing_interfaces())
        if taken:
            raise MachineError("topology", f"{', '.join(taken[:5])} already exist(s) and were "
                               "not created by this run; if a killed FabricLab run left them, "
                               "run `fabriclab clean`")

    def start(self) -> None:
        t0 = time.monotonic()
        setLogLevel("warning")
        bridges, intfs = planned_names(self.topo)
        if self.cluster is not None and self.topo.mgmt_switches():
            raise MachineError("topology.mgmt_bw", "a management network is not split over "
                               "several machines yet; run it on one")
        if self.cluster is not None:
            self.cluster.open(self.record.run_id, self.record, self.run_dir)
            bridges, intfs = self.cluster.claim(bridges, intfs)
        self.check_free(bridges, intfs)
        self.record.bridges = bridges
        self.record.interfaces = intfs
        self.record.save()
        self.controller = Controller(self.runtime,
                                     config.build(self.desc, self.policy, self.seed,
                                                       self.gateways, self.env.ecn,
                                                       str(BPF_BUILD_DIR)),
                                     self.run_dir, self.record)
        self.controller.start()
        if self.cluster is not None:
            self.cluster.reverse_tunnels(self.controller.port, self.record)
        self.timings["controller_s"] = time.monotonic() - t0
        ShapedIntf.netem_available = self.env.netem
        ctrl = partial(LabControllerRef, ip="127.0.0.1", port=self.controller.port)
        with ShapingBatch(TSO_LIMIT_CLUSTER if self.cluster else TSO_LIMIT) as shaping:
            self._build_and_start(ctrl, shaping, t0)
        self.fast_reconnect()
        t1 = time.monotonic()
        self.controller.wait_ready()
        self.timings["programmed_s"] = time.monotonic() - t1
        self.timings["ready_s"] = time.monotonic() - t0

    def _build_and_start(self, ctrl: partial, shaping: ShapingBatch, t0: float) -> None:
        """Mininet builds the network and starts the switches; links are shaped after that,
        all at once (:class:`ShapingBatch`)."""
        assert self.controller is not None
        # batch: one ovs-vsctl for every switch (Mininet's batchStartup), not one each.
        switch = {"datapath": self.env.datapath, "failMode": "secure",
                  "protocols": "OpenFlow13", "batch": True}
        common = {"controller": ctrl, "autoSetMacs": False, "autoStaticArp": False,
                  "build": False, "waitConnected": False}
        if self.cluster is None:
            self.net = Mininet(topo=self.topo,
                               switch=partial(lab_switch, switch, self.topo.mgmt_switches()),
                               link=ShapedLink, **common)
        else:
            self.net = self.cluster.network(self.topo, LabRemoteSwitch, switch, **common)
        self.net.build()
        shaping.set_up()
        self.static_arp()
        nodes = self.net.hosts + self.net.switches + self.net.controllers
        for node in self.cluster.record_nodes(nodes) if self.cluster else nodes:
            self.record.pids.append({"pid": node.pid, "start": state.proc_start_time(node.pid),
                                     "what": f"shell {node.name}"})
        self.record.save()
        for host in self.net.hosts:
            # txrehash=0: a TCP socket keeps its hash. Linux re-rolls it after a timeout or a
            # spurious retransmission, and the kernel datapath's select groups hash on it:
            # measured in the VM, a flow's ACKs moved to the other spine mid-run. The per-flow
            # hashing the lab shows assumes a flow keeps its path (the userspace datapath
            # hashes the headers). Kernels before 5.19 lack the switch (-e: no error).
            ports = host.cmd("sysctl -qw net.ipv6.conf.all.disable_ipv6=1 "
                             "net.ipv6.conf.default.disable_ipv6=1 net.ipv4.tcp_ecn=0 "
                             f"{EPHEMERAL_SYSCTL} {HOST_TCP_SYSCTLS}; "
                             "sysctl -qew net.core.txrehash=0; "
                             "sysctl -n net.ipv4.ip_local_port_range")
            if ports.split() != [str(p) for p in HOST_EPHEMERAL_PORTS]:
                raise MachineError("topology", f"{host.name}: could not move its ephemeral "
                                   f"ports to {HOST_EPHEMERAL_PORTS}: {ports.strip()!r}")
        self.timings["build_s"] = time.monotonic() - t0
        t1 = time.monotonic()
        self.net.start()
        self.timings["switches_s"] = time.monotonic() - t1
        t1 = time.monotonic()
        shaping.apply()
        self.timings["shaping_s"] = time.monotonic() - t1

    def fast_reconnect(self) -> None:
        """Switches retry a lost controller every second, not after up to 8 s (OVS's
        default backoff), so a restarted controller is found as soon as it listens.

        Only this run's controller records are changed: they are the ones whose target is
        this run's port.
        """
        assert self.controller is not None
        out = subprocess.run(["ovs-vsctl", "--timeout=10", "--format=csv", "--no-headings",
                              "--columns=_uuid,target", "list", "Controller"],
                             capture_output=True, text=True, check=False).stdout
        target = f"tcp:127.0.0.1:{self.controller.port}"
        cmd = ["ovs-vsctl", "--timeout=10"]
        for line in out.splitlines():
            uuid, _, tgt = line.partition(",")
            if tgt.strip().strip('"') == target:
                cmd += ["--", "set", "Controller", uuid.strip(), "max_backoff=1000"]
        if len(cmd) > 2:
            subprocess.run(cmd, check=False, capture_output=True)
        if self.cluster is not None:
            # The workers' switches: every Controller record with this run's target
            # (they all name their own 127.0.0.1, the reverse tunnel's end).
            self.cluster.on_workers(["sh", "-c", "for u in $(ovs-vsctl --timeout=10 "
                                     "--columns=_uuid --bare find Controller "
                                     f"target='\"{target}\"'); do ovs-vsctl --timeout=10 "
                                     "set Controller $u max_backoff=1000; done"])

    def static_arp(self) -> None:
        """Every fabric host knows every other's MAC: the controller answers no ARP.

        Not Mininet's ``autoStaticArp``: it runs ``arp -s`` per pair through the shells
        and, for a node without a Mininet address (a router of ``lab.net.edge``), passes it
        "None", which ``arp`` tries to resolve as a host name.

        The management network's addresses likewise, on each host's management interface:
        its switch would flood and learn ARP, but then ARP frames would be counted on its
        links along with the traffic they carry.
        """
        assert self.net is not None
        hosts = self.desc["hosts"]
        mgmt = {h["name"]: h for h in self.mgmt_hosts()}
        for h in hosts:
            node = self.net.get(h["name"])
            lines = [f"neigh replace {o['ip']} lladdr {o['mac']} dev "
                     f"{node.defaultIntf().name} nud permanent" for o in hosts if o is not h]
            mine = mgmt.get(h["name"])
            if mine is not None:
                lines += [f"neigh replace {o['ip']} lladdr {o['mac']} dev {mine['intf']} "
                          "nud permanent" for o in mgmt.values() if o is not mine]
            batch = "\n".join(lines)
            node.cmd(f"ip -batch - <<'EOF'\n{batch}\nEOF")

    def mgmt_hosts(self) -> list[dict[str, object]]:
        """The management network's host entries (name, ip, mac, intf); none without one."""
        mgmt = self.desc.get("mgmt")
        return list(mgmt["hosts"]) if isinstance(mgmt, dict) else []

    def pingall(self, timeout_s: float = 1.0) -> float:
        """Every host pings every other once; returns the loss in per cent."""
        assert self.net is not None
        if self.cluster is not None:
            # Raw sockets need the hosts' namespaces on this machine: Mininet's own ping
            # (one ``ping`` per pair, through the hosts' shells) reaches every worker.
            return float(self.net.pingAll(timeout=str(max(1, round(timeout_s)))))
        return ping_all(self.net.hosts, timeout_s)

    def pingall_mgmt(self, timeout_s: float = 1.0) -> float:
        """Every host pings every other's management address once; the loss in per cent
        (0 without a management network)."""
        assert self.net is not None
        mgmt = self.mgmt_hosts()
        return ping_all([self.net.get(h["name"]) for h in mgmt], timeout_s,
                        ips=[str(h["ip"]) for h in mgmt])

    def host(self, name: str):
        assert self.net is not None
        return self.net.get(name)

    # -- teardown ---------------------------------------------------------------------------
    def stop(self) -> dict[str, int]:
        """Stop the controller, then remove exactly what the record lists.

        Not ``Mininet.stop()``: it deletes links one interface at a time through the nodes'
        shells. The record already names every process, bridge and root-namespace veth, and
        removing those in bulk (a host's veth goes with its namespace) is 2-3x faster.
        """
        t0 = time.monotonic()
        if self.controller is not None:
            self.controller.stop()
        if self.cluster is not None:
            self.cluster.close()        # each agent removes its worker's share
        left = state.remove(self.record)
        self.net = None
        self.timings["stop_s"] = time.monotonic() - t0
        return left
