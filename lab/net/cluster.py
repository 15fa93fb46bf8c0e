"""One fabric over several machines, built by Mininet's cluster edition.

Debian's Mininet ships it as ``mininet.examples.cluster``: ``MininetCluster`` places every
node on a server, starts remote nodes through ssh shells (``RemoteHost``,
``RemoteOVSSwitch``) and turns a link whose ends landed on two servers into a tunnel
(``RemoteLink``). FabricLab uses it as it is, with four choices of its own:

* **placement** is FabricLab's partition plan (``lab.analysis.partition``): hosts stay with
  their switch, a fat-tree keeps its pods whole; Mininet's placers know nothing of pods;
* **tunnels are gretap**, as Mininet's ``RemoteGRELink`` makes them, one GRE key per cut
  link, but with the emulated links' own MTU (1500, not Mininet's 1450: the lab's wire
  constants and TCP's ceiling assume 1500-byte packets), so the network between the
  workers must carry 1542-byte packets (``lab.model.cluster``). GRE rather than VXLAN: 8
  bytes less per packet, no UDP port to keep free on every worker, and it is the tunnel
  the cluster edition already implements. A tunnel end has the name the veth end would
  have had, so it is shaped (rate, byte queue, delay, ECN) and counted like any port;
* **the controller stays on 127.0.0.1**: ``MininetCluster.addController`` would move it to
  an outward address; instead every worker reaches the head's controller through an ssh
  reverse tunnel to its own loopback (``lab.net.fabric``), and nothing listens outward;
* **no ``mn -c``**: the cluster edition's ``ClusterCleanup`` runs it on every server. It is
  disarmed here; every worker's agent removes what its run record lists instead.

Remote processes carry the run's marker (``FABRICLAB_RUN``) like local ones do, so a
worker's agent finds every one of them.
"""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import time
from collections.abc import Mapping
from functools import partial
from operator import attrgetter
from pathlib import Path
from typing import Any

from mininet.examples import cluster as mncluster
from mininet.net import Mininet

from lab.machine import environment, remote, state
from lab.model.cluster import LINK_MTU, ClusterError, ClusterSpec
from lab.model.errors import MachineError
from lab.net.links import ShapedIntf


def _never(*_args: object, **_kwargs: object) -> None:
    raise MachineError("cluster", "FabricLab never runs `mn -c` on a worker (it would remove "
                       "other people's bridges); `fabriclab clean --cluster FILE` cleans by "
                       "record")


mncluster.ClusterCleanup.cleanup = classmethod(_never)   # type: ignore[assignment]


class _Marked:
    """Remote commands run with the run's marker in their environment, each node's over
    an ssh connection of its own.

    One connection a worker, shared by all its nodes, is what the cluster edition offers
    (``controlPath``), but sshd grants a connection 10 sessions (``MaxSessions``); past
    that every shell and program opens a connection of its own, and a burst of them (a
    scenario's iperf3 servers, started together) meets sshd's ``MaxStartups``, which drops
    some: their programs never start. A node's own connection carries its shell and the
    programs started in it, opened one node after the other while the network is built.
    """

    run_id = ""

    def __init__(self, name: str, *args: Any, control_dir: str | None = None,
                 **kwargs: Any) -> None:
        if control_dir:
            kwargs["controlPath"] = f"{control_dir}/ssh-{name}"
        super().__init__(name, *args, **kwargs)  # type: ignore[call-arg]

    def _popen(self, cmd: Any, sudo: bool = True, tt: bool = True, **params: Any) -> Any:
        if getattr(self, "isRemote", False):
            argv = cmd.split() if isinstance(cmd, str) else list(cmd)
            cmd = ["env", f"FABRICLAB_RUN={_Marked.run_id}", *argv]
        return super()._popen(cmd, sudo=sudo, tt=tt, **params)  # type: ignore[misc]


class LabRemoteHost(_Marked, mncluster.RemoteHost):
    """A host on any worker (the head's own are local ``RemoteHost`` s)."""


class LabRemoteSwitch(_Marked, mncluster.RemoteOVSSwitch):
    """An OVS switch on any worker, started in per-worker batches.

    The cluster edition sends a worker's batch through a switch's shell, a terminal whose
    line discipline keeps at most 4095 characters of a line: a longer ``ovs-vsctl`` line is
    cut, and not one bridge of that worker is made (a k=4 fat-tree's ten switches a worker
    write 6,000). So a batch line stays well under that (Mininet splits the batch at
    ``argmax``), and an error ``ovs-vsctl`` prints stops the run, not ignored.
    """

    argmax = 3000

    @classmethod
    def batchStartup(cls, switches: Any, **_kwargs: Any) -> Any:  # noqa: N802 - Mininet API
        by_server = itertools.groupby(sorted(switches, key=attrgetter("server")),
                                      attrgetter("server"))
        for server, members in by_server:
            group = tuple(members)
            first = group[0]

            def run(line: str, shell: bool = True, node: Any = first, on: str = server) -> None:
                out = node.cmd(line).strip()
                if "ovs-vsctl:" in out:            # (success prints created rows' UUIDs)
                    raise MachineError("cluster", f"starting the switches on {on}: "
                                       f"{out[-300:]}")

            # OVSSwitch's batch, with this class's argmax (the cluster edition's skips it).
            super(mncluster.RemoteOVSSwitch, cls).batchStartup(group, run=run)
        return switches


class PlanPlacer(mncluster.Placer):
    """Places every node where the partition plan put it."""

    def __init__(self, *args: Any, where: Mapping[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.where = where

    def place(self, node: str) -> str:
        return self.where[node]


class ShapedClusterLink(mncluster.RemoteLink):
    """A shaped link (``ShapedIntf`` at both ends): a veth pair on one worker, a gretap
    tunnel between two."""

    keys = itertools.count(1)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("cls1", ShapedIntf)
        kwargs.setdefault("cls2", ShapedIntf)
        super().__init__(*args, **kwargs)

    def makeTunnel(self, node1: Any, node2: Any, intfname1: str, intfname2: str,  # noqa: N802
                   addr1: str | None = None, addr2: str | None = None) -> int:
        """Both ends of a gretap tunnel, each in its node's namespace on its worker."""
        key = next(ShapedClusterLink.keys)
        ends = ((node1, intfname1, addr1, node1.serverIP, node2.serverIP),
                (node2, intfname2, addr2, node2.serverIP, node1.serverIP))
        for node, name, addr, local_ip, peer_ip in ends:
            mac = f" address {addr}" if addr else ""
            # One command per call: rcmd splits its line into argv (no shell on the head).
            for cmd in (f"ip link add name {name}{mac} mtu {LINK_MTU} type gretap "
                        f"local {local_ip} remote {peer_ip} ttl 64 key {key}",
                        f"ip link set {name} netns {node.pid}"):
                out = node.rcmd(cmd).strip()
                if out:
                    raise MachineError("cluster", f"{node.name} on {node.server}: `{cmd}` "
                                       f"failed: {out[-200:]}")
        self.tunnel = key
        return key

    def stop(self) -> None:
        """Nothing: every worker's agent deletes its tunnel ends by record."""


class LabCluster(mncluster.MininetCluster):
    """``MininetCluster`` with the lab's placement and its controller kept on loopback."""

    def addController(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 - Mininet API
        return Mininet.addController(self, *args, **kwargs)


def servers(where: Mapping[str, str]) -> list[str]:
    """Mininet's server list for a placement: 'localhost' first, then the others."""
    return ["localhost", *sorted(set(where.values()) - {"localhost"})]


class ClusterRun:
    """A cluster's share of one run, around Mininet's: every remote worker's agent (its
    lock and run record), the controller's reverse tunnels, and the network itself.

    ``where`` places every node of the topology on a worker (by the workers' names in the
    cluster file); it comes from the partition plan.
    """

    def __init__(self, spec: ClusterSpec, where: Mapping[str, str]) -> None:
        self.spec = spec
        self.where = dict(where)
        self.agents: dict[str, remote.Agent] = {}
        self.offsets: dict[str, remote.ClockOffset] = {}
        self.offsets_end: dict[str, remote.ClockOffset] = {}
        self.timings: dict[str, float] = {}
        self.placement: remote.Placement | None = None
        self.work = state.STATE_DIR
        #: What each worker's agent removed when the run ended.
        self.removed: dict[str, dict[str, int]] = {}
        #: Drop and error counters of each worker's NIC towards the others, at the start.
        self.nic0: dict[str, dict[str, int]] = {}
        self.nic_drops: dict[str, int] = {}
        #: Each worker's expected fidelity (``lab.model.capacity``), before the run.
        self.expected: dict[str, Any] = {}

    def server(self, worker: str) -> str:
        """Mininet's name of a worker: 'localhost' for the head, else its address."""
        return "localhost" if worker == self.spec.head else self.spec.worker(worker).address

    def _remote(self, names: list[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name in names:
            out.setdefault(self.where[remote.node_of(name)], []).append(name)
        return out

    # -- before anything exists --------------------------------------------------------
    def open(self, run_id: str, record: state.RunRecord, work: Path) -> None:
        """Every remote worker, in the file's order: reachable without a password, its
        agent started (its lock taken, its record opened), the same lab as the head's, and
        its clock measured. The first refusal stops the run with one line naming the
        worker; agents already started remove what they made and let go of their locks."""
        t0 = time.monotonic()
        self.work = work
        mine = environment.lab_version()
        try:
            for w in self.spec.workers:
                if w.name == self.spec.head:
                    continue
                remote.reachable(w)
                agent = remote.Agent(w, run_id)
                self.agents[w.name] = agent
                hello = agent.start()
                assert agent.proc is not None
                record.add_pid(agent.proc.pid, f"ssh agent {w.name}")
                if hello["version"] != mine:
                    raise ClusterError(f"workers[{w.name}]", f"runs lab {hello['version']}, "
                                       f"the head {mine}: run `fabriclab cluster setup "
                                       f"{self.spec.path}` to bring it to the head's code")
                self.offsets[w.name] = agent.clock()
        except BaseException:
            self.close()
            raise
        _Marked.run_id = run_id
        self.nic0 = self._nic_counters()
        self.placement = remote.Placement(self.spec.head, self.where, self.agents,
                                          self.offsets)
        remote.set_current(self.placement)
        self.timings["workers_s"] = time.monotonic() - t0

    def claim(self, bridges: list[str], intfs: list[str]) -> tuple[list[str], list[str]]:
        """Check and record the names each worker will create; returns the head's own."""
        rb, ri = self._remote(bridges), self._remote(intfs)
        for name, agent in self.agents.items():
            taken = agent.request("check_free", bridges=rb.get(name, []),
                                  interfaces=ri.get(name, []))["taken"]
            if taken:
                raise MachineError(f"workers[{name}]", f"{', '.join(taken[:5])} already "
                                   "exist(s) there and were not created by this run; if a "
                                   "killed FabricLab run left them, run `fabriclab clean "
                                   f"--cluster {self.spec.path}`")
            agent.request("record", bridges=rb.get(name, []), interfaces=ri.get(name, []))
        head = self.spec.head
        return rb.get(head, []), ri.get(head, [])

    def reverse_tunnels(self, port: int, record: state.RunRecord,
                        timeout_s: float = 60.0) -> None:
        """Each remote worker's 127.0.0.1:``port`` forwarded to the head's controller."""
        for name, agent in self.agents.items():
            fwd = f"127.0.0.1:{port}:127.0.0.1:{port}"
            proc = subprocess.Popen(
                ["ssh", *remote.SSH_OPTIONS, "-N", "-o", "ExitOnForwardFailure=yes", "-R", fwd,
                 agent.worker.ssh],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            record.add_pid(proc.pid, f"ssh controller tunnel {name}")
            deadline = time.monotonic() + timeout_s
            while True:
                out = agent.request("run", argv=["ss", "-Hltn", f"sport = :{port}"])
                if f":{port}" in out["stdout"]:
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                    raise MachineError(f"workers[{name}]", "the controller's reverse tunnel "
                                       f"to 127.0.0.1:{port} did not open: "
                                       f"{err.strip()[-200:] or 'timed out'}")
                time.sleep(0.2)

    # -- the network ---------------------------------------------------------------------
    def network(self, topo: Any, switch: type, switch_params: dict[str, Any],
                **kwargs: Any) -> LabCluster:
        """Mininet's cluster network for ``topo`` (not built yet)."""
        where = {n: self.server(w) for n, w in self.where.items()}
        ips = {self.server(w.name): w.address for w in self.spec.workers}
        users = {w.ssh.partition("@")[0] for w in self.spec.workers
                 if not w.local and "@" in w.ssh}
        # One ssh connection per remote node, shared by its shell and every program started
        # in it (ssh's ControlMaster; see _Marked): a handshake each took a second under TCG.
        mux = {"control_dir": str(self.work)}
        return LabCluster(
            topo=topo, servers=servers(where), serverIP=ips,
            user=users.pop() if len(users) == 1 else "root", precheck=False,
            placement=partial(PlanPlacer, where=where), host=partial(LabRemoteHost, **mux),
            switch=partial(switch, **switch_params, **mux), link=ShapedClusterLink,
            **kwargs)

    def record_nodes(self, nodes: list[Any]) -> list[Any]:
        """Give each remote worker's agent the PIDs of its nodes' shells; returns the
        head's own nodes."""
        by: dict[str, list[list[Any]]] = {}
        local = []
        for node in nodes:
            if getattr(node, "isRemote", False):
                by.setdefault(self.where[node.name], []).append([node.pid,
                                                                 f"shell {node.name}"])
            else:
                local.append(node)
        for name, pids in by.items():
            self.agents[name].request("record", pids=pids)
        return local

    def on_workers(self, argv: list[str]) -> None:
        """Run a command on every remote worker (e.g. an ``ovs-vsctl`` of the run's own)."""
        for agent in self.agents.values():
            agent.request("run", argv=argv)

    # -- after ---------------------------------------------------------------------------
    def _nic_counters(self) -> dict[str, dict[str, int]]:
        """Each worker's NIC towards the others: its drop and error counters."""
        out = {}
        for w in self.spec.workers:
            agent = self.agents.get(w.name)
            if agent is None and w.name != self.spec.head:
                continue
            out[w.name] = (remote.nic_counters(w.address) if agent is None else
                           agent.request("nic", address=w.address)["counters"])
        return out

    def close(self) -> dict[str, dict[str, int]]:
        """Every agent removes what its record lists and lets go of its worker's lock."""
        if self.placement is not None:
            with contextlib.suppress(ClusterError):
                nic1 = self._nic_counters()
                self.nic_drops = {n: sum(nic1[n].values()) - sum(c.values())
                                  for n, c in self.nic0.items() if n in nic1}
        for name, agent in self.agents.items():
            if agent.proc is not None and agent.proc.poll() is None:
                with contextlib.suppress(ClusterError):
                    self.offsets_end[name] = agent.clock()
            self.removed[name] = agent.close().get("removed", {})
        self.agents = {}
        remote.set_current(None)
        return self.removed

    @property
    def fidelity(self) -> dict[str, dict[str, float | None]]:
        """Per worker, its least idle second and the lab's CPU on it (judged windows)."""
        return self.placement.fidelity if self.placement is not None else {}

    def invalid_because(self) -> list[str]:
        """Why the run's numbers do not describe the network, worker by worker: a clock
        known too loosely to place its samples, packets lost on the network between the
        workers. (A worker below the idle line is the measurements' to say: its least
        idle second is the run's when it is the least.)"""
        notes = []
        for name, o in self.offsets.items():
            end = self.offsets_end.get(name)
            skew = o.error_s + (abs(end.offset_s - o.offset_s) if end else 0.0)
            if skew > CLOCK_BOUND_S:
                notes.append(f"worker {name}: clock known to {skew * 1e3:.1f} ms "
                             f"(> {CLOCK_BOUND_S * 1e3:g} ms): its samples cannot be placed")
        for name, drops in self.nic_drops.items():
            if drops > 0:
                notes.append(f"worker {name}: its NIC towards the other workers dropped "
                             f"{drops} packets (no configured queue explains them)")
        return notes

    def summary(self) -> dict[str, Any]:
        """result.json's ``cluster`` section, less what the measurements add."""
        return {"head": self.spec.head, "tunnel": self.spec.tunnel,
                "workers": [w.as_dict() for w in self.spec.workers],
                "placement": dict(sorted(self.where.items())),
                "clock": {n: {**o.as_dict(), **({"drift_ms": round(
                    (self.offsets_end[n].offset_s - o.offset_s) * 1e3, 3)}
                    if n in self.offsets_end else {})} for n, o in self.offsets.items()}}


#: The most a worker's clock may be off (the offset's error plus its drift over the run)
#: for its samples to land in the right sampling interval: half of one (10 Hz).
CLOCK_BOUND_S = 0.05
