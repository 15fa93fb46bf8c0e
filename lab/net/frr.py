"""FRR routers as Mininet hosts: configs from ``lab.net.bgp``, daemons started and stopped by PID.

The model is IPMininet's (routing daemons inside Mininet hosts, configs generated from the
topology), cut down to what the lab needs: zebra + bgpd (+ bfdd when a session uses BFD)
per router, each with private paths under the run directory, so nothing is shared with
another router, another run or an FRR the machine may run itself. Every daemon PID goes into
the run record the moment it is known and every daemon carries ``FABRICLAB_RUN`` in its
environment, so ``lab.machine.state.remove`` (and ``fabriclab clean`` after a ``kill -9``)
stops them by record; nothing here ever looks for a process by name.

Use::

    with router_session(MyEdge(), "streaming-edge") as rnet:   # lock, record, namespaces
        rnet.start()                 # zebra, bfdd, bgpd per router, PIDs into the record
        rnet.wait_established(5)     # every configured session, from vtysh JSON
        rnet.get("border1").kernel_nexthops("203.0.113.0/24")
    # gone by record: daemons and shells by PID, run dirs by path

A lab that already holds a record (``lab.run.fabric_session``) builds the routers into its
own Mininet (hosts of class ``FrrRouter`` with ``plan=``) and calls ``start_routers``.

Two FRR 8.4 habits matter for that: ``-N NAME`` creates ``/var/run/frr/NAME`` even when
every path is overridden (so it is not used), and each daemon keeps a crash-log directory
``/var/tmp/frr/<daemon>.<pid>`` that a clean exit removes but ``kill -9`` leaves behind (so
it is recorded as a path of the run).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.node import Host
from mininet.topo import Topo

from lab.machine import state
from lab.model.errors import MachineError, TopologyError
from lab.model.flows import EPHEMERAL_SYSCTL
from lab.net.bgp import BgpNetwork, Router, Subnet
from lab.net.bgp import Host as PlanHost
from lab.net.links import HOST_TCP_SYSCTLS, ShapedLink
from lab.net.topobase import planned_names

FRR_BIN = Path("/usr/lib/frr")
VTYSH = "vtysh"
FRR_USER = "frr"
#: Where FRR 8.4 keeps per-daemon crash logs, named ``<daemon>.<pid>``.
FRR_TMP = Path("/var/tmp/frr")
HASH_SYSCTL = "net.ipv4.fib_multipath_hash_policy"


def installed() -> bool:
    return all((FRR_BIN / d).exists() for d in ("zebra", "bgpd", "bfdd")) and bool(
        shutil.which(VTYSH))


def check_config(text: str, what: str = "frr") -> None:
    """Refuse a config FRR's own parser rejects (``vtysh -C``; the daemons' ``-C`` exits 0
    on unknown commands, vtysh does not)."""
    out = subprocess.run([VTYSH, "-C", "-f", "/dev/stdin"], input=text, capture_output=True,
                         text=True, timeout=30)
    if out.returncode != 0:
        raise TopologyError(what, f"FRR rejects the generated config: "
                            f"{(out.stdout + out.stderr).strip()}")


def probe_hash_policy(value: int, fld: str = "hash_policy") -> int:
    """Refuse a ``fib_multipath_hash_policy`` this kernel does not have, before anything starts.

    Asks the kernel in a throwaway network namespace: the sysctl is per namespace.
    """
    out = subprocess.run(["unshare", "--net", "sysctl", "-qw", f"{HASH_SYSCTL}={value}"],
                         capture_output=True, text=True, timeout=10)
    if out.returncode != 0:
        raise TopologyError(fld, f"this kernel rejects {HASH_SYSCTL}={value} "
                            f"({out.stderr.strip() or 'refused'}); 0 = L3, 1 = L4")
    return value


class PlannedHost(Host):
    """A Mininet host whose addresses and gateway come from the ``BgpNetwork`` plan.

    Addresses are set with ``ip addr`` (several per interface if the plan says so), not with
    Mininet's single ``ip=`` per node; IPv6 is off, as on every lab link.
    """

    def plan_node(self) -> Router | PlanHost:
        return self.params["plan"]

    def sh(self, cmd: str, fld: str) -> str:
        """Run ``cmd`` in the node; a non-zero exit is a TopologyError naming ``fld``."""
        out = self.cmd(f"{cmd} 2>&1; echo __rc=$?").strip()
        text, _, rc = out.rpartition("__rc=")
        if rc.strip() != "0":
            raise TopologyError(fld, f"{self.name}: `{cmd}` failed: {text.strip()}")
        return text

    def config(self, **params: Any) -> dict:
        result = super().config(**params)
        node = self.plan_node()
        self.sh("sysctl -qw net.ipv6.conf.all.disable_ipv6=1 "
                f"net.ipv6.conf.default.disable_ipv6=1 {EPHEMERAL_SYSCTL} {HOST_TCP_SYSCTLS}",
                f"{node.name}.sysctl")
        for intf in node.interfaces:
            for addr in intf.addresses:
                self.sh(f"ip addr replace {addr} dev {intf.name}",
                        f"{node.name}.interfaces.{intf.name}")
            self.sh(f"ip link set {intf.name} up", f"{node.name}.interfaces.{intf.name}")
        gateway = getattr(node, "gateway", None)
        if gateway is not None:
            self.sh(f"ip route replace default via {gateway}", f"hosts.{node.name}.gateway")
        return result


class FrrRouter(PlannedHost):
    """A router: forwarding on, rp_filter off, a hash policy, and FRR daemons by PID."""

    DAEMONS = ("zebra", "bfdd", "bgpd")

    def __init__(self, name: str, **params: Any) -> None:
        super().__init__(name, **params)
        self.run_dir: Path | None = None
        self.daemons: dict[str, dict[str, int | None]] = {}

    @property
    def router(self) -> Router:
        node = self.plan_node()
        assert isinstance(node, Router)
        return node

    def config(self, **params: Any) -> dict:
        result = super().config(**params)
        r = self.router
        # Strict rp_filter would drop the return half of asymmetric multipath flows; the
        # kernel applies max(all, <intf>), so every interface is set too.
        names = ["all", "default", "lo"] + [i.name for i in r.interfaces]
        self.sh("sysctl -qw net.ipv4.ip_forward=1 "
                + " ".join(f"net.ipv4.conf.{n}.rp_filter=0" for n in names),
                f"routers.{r.name}.sysctl")
        if r.hash_policy is not None:
            self.set_hash_policy(r.hash_policy)
        return result

    def set_hash_policy(self, value: int) -> None:
        """``fib_multipath_hash_policy`` in this namespace only: 0 = L3, 1 = L4."""
        fld = f"routers.{self.name}.hash_policy"
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TopologyError(fld, f"expected a non-negative integer, got {value!r}")
        out = self.cmd(f"sysctl -qw {HASH_SYSCTL}={value} 2>&1; echo __rc=$?").strip()
        text, _, rc = out.rpartition("__rc=")
        if rc.strip() != "0":
            raise TopologyError(fld, f"this kernel rejects {HASH_SYSCTL}={value} "
                                f"({text.strip() or 'refused'}); 0 = L3, 1 = L4")
        self.router.hash_policy = value

    def hash_policy(self) -> int:
        return int(self.cmd(f"sysctl -n {HASH_SYSCTL}").strip())

    # -- daemons ------------------------------------------------------------------------------
    def wanted_daemons(self) -> list[str]:
        return [d for d in self.DAEMONS if d != "bfdd" or self.router.uses_bfd]

    def prepare(self, plan: BgpNetwork, run_dir: Path, record: state.RunRecord) -> str:
        """Write configs into ``run_dir/<name>`` (recorded first) and return the start script.

        Order zebra, bfdd, bgpd: bgpd registers its BFD peers through zebra, and with bfdd
        already there they are up with the session instead of after a replay.
        """
        d = run_dir / self.name
        record.paths.append(str(d))
        record.save()
        d.mkdir(parents=True, exist_ok=True)
        configs = plan.configs(self.name)
        for fname, text in configs.items():
            (d / fname).write_text(text)
        shutil.chown(d, FRR_USER, FRR_USER)
        for p in d.iterdir():
            shutil.chown(p, FRR_USER, FRR_USER)
        self.run_dir = d
        cmds = []
        for daemon in self.wanted_daemons():
            args = [str(FRR_BIN / daemon), "-d", "-f", str(d / f"{daemon}.conf"),
                    "-i", str(d / f"{daemon}.pid"), "--vty_socket", str(d),
                    "-z", str(d / "zserv.api"), "-A", "127.0.0.1", "-P", "0",
                    "--log", f"file:{d / daemon}.log"]
            if daemon == "bfdd":
                args += ["--bfdctl", str(d / "bfdd.sock")]
            cmds.append(" ".join(args))
        # -d returns once the daemon is up (FRR waits for its child), so && orders them.
        return " && ".join(cmds)

    def register(self, record: state.RunRecord) -> None:
        """Read the pid files; record every PID and its crash-log directory."""
        assert self.run_dir is not None
        for daemon in self.wanted_daemons():
            pid = int((self.run_dir / f"{daemon}.pid").read_text().strip())
            self.daemons[daemon] = {"pid": pid, "start": state.proc_start_time(pid)}
            record.paths.append(str(FRR_TMP / f"{daemon}.{pid}"))
            record.add_pid(pid, f"frr {daemon} {self.name}")   # saves the paths too

    def stop_daemons(self, timeout: float = 3.0) -> None:
        """SIGTERM each daemon by its recorded PID (bgpd first), wait until all are gone."""
        pids = [(int(v["pid"]), v["start"]) for _, v in sorted(  # type: ignore[arg-type]
            self.daemons.items(), key=lambda kv: -self.DAEMONS.index(kv[0]))]
        for pid, start in pids:
            if state.pid_alive(pid, start):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(state.pid_alive(p, s) for p, s in pids):
            time.sleep(0.05)
        for pid, start in pids:
            if state.pid_alive(pid, start):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.daemons.clear()

    # -- asking FRR ---------------------------------------------------------------------------
    def vtysh(self, cmd: str, timeout: float = 10.0) -> str:
        """One vtysh command against this router's daemons (their private vty sockets)."""
        if self.run_dir is None:
            raise MachineError(f"routers.{self.name}", "FRR is not running on this router")
        out = subprocess.run([VTYSH, "--vty_socket", str(self.run_dir), "-c", cmd],
                             capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise MachineError(f"routers.{self.name}", f"vtysh -c {cmd!r} failed: "
                               f"{(out.stdout + out.stderr).strip()}")
        return out.stdout

    def vtysh_json(self, cmd: str) -> Any:
        text = self.vtysh(cmd if cmd.endswith(" json") else f"{cmd} json")
        return json.loads(text) if text.strip() else {}

    def bgp_summary(self) -> dict[str, Any]:
        """``show bgp summary json``, IPv4 unicast part: routerId, as, peers{addr: {...}}."""
        return self.vtysh_json("show bgp summary").get("ipv4Unicast", {})

    def ip_routes(self) -> dict[str, Any]:
        """``show ip route json``: prefix -> [route entries with their nexthops]."""
        return self.vtysh_json("show ip route")

    def bfd_peers(self) -> list[dict[str, Any]]:
        return self.vtysh_json("show bfd peers") if self.router.uses_bfd else []

    def session_states(self) -> dict[str, str]:
        """Configured neighbour address -> FRR's state for it (missing: 'Unknown')."""
        peers = self.bgp_summary().get("peers", {})
        return {str(n.address): peers.get(str(n.address), {}).get("state", "Unknown")
                for n in self.router.neighbors}

    def wait_established(self, timeout: float = 10.0) -> float:
        """Poll until every configured session is Established; the seconds it took."""
        t0 = time.monotonic()
        while True:
            states = self.session_states()
            if all(s == "Established" for s in states.values()):
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise MachineError(f"routers.{self.name}.bgp", f"sessions not Established "
                                   f"after {timeout:g} s: {states}")
            time.sleep(0.05)

    def wait_bfd_up(self, timeout: float = 10.0) -> float:
        """Poll until every BFD session of this router is up; the seconds it took.

        A BFD session is slower than its BGP session at start: until it is up, both ends
        send at most one packet a second (RFC 5880 6.8.3), whatever the profile says.
        """
        t0 = time.monotonic()
        want = {str(n.address) for n in self.router.neighbors if n.bfd}
        while want:
            status = {p.get("peer"): p.get("status") for p in self.bfd_peers()}
            if all(status.get(a) == "up" for a in want):
                break
            if time.monotonic() - t0 > timeout:
                raise MachineError(f"routers.{self.name}.bfd", f"BFD not up after "
                                   f"{timeout:g} s: {status}")
            time.sleep(0.05)
        return time.monotonic() - t0

    def kernel_nexthops(self, prefix: str) -> list[dict[str, str]]:
        """The kernel's nexthops for ``prefix`` in this namespace (``ip -j route``)."""
        out = self.cmd(f"ip -j route show exact {prefix}").strip()
        routes = json.loads(out) if out else []
        hops = []
        for route in routes:
            for nh in route.get("nexthops", [route]):
                hops.append({"gateway": nh.get("gateway", ""), "dev": nh.get("dev", "")})
        return hops

    def wait_nexthops(self, prefix: str, count: int, timeout: float = 10.0) -> float:
        """Poll until the kernel holds exactly ``count`` nexthops for ``prefix``."""
        t0 = time.monotonic()
        while len(self.kernel_nexthops(prefix)) != count:
            if time.monotonic() - t0 > timeout:
                raise MachineError(f"routers.{self.name}.routes", f"{prefix} has "
                                   f"{self.kernel_nexthops(prefix)} after {timeout:g} s, "
                                   f"wanted {count} nexthops")
            time.sleep(0.05)
        return time.monotonic() - t0

    def tx_bytes(self, intfs: list[str]) -> dict[str, int]:
        """Kernel tx byte counters (/sys/class/net, as this namespace sees it)."""
        paths = " ".join(f"/sys/class/net/{i}/statistics/tx_bytes" for i in intfs)
        return dict(zip(intfs, (int(x) for x in self.cmd(f"cat {paths}").split()),
                        strict=True))


def start_routers(routers: list[FrrRouter], plan: BgpNetwork, run_dir: Path,
                  record: state.RunRecord, check: bool = True) -> float:
    """Start every router's daemons, routers side by side; the seconds it took.

    Configs are checked with FRR's own parser first (``check``), so a config the lab
    cannot generate correctly fails before any daemon runs.
    """
    t0 = time.monotonic()
    scripts = {r.name: r.prepare(plan, run_dir, record) for r in routers}
    if check:
        procs = [(r.name, f, subprocess.Popen([VTYSH, "-C", "-f", str(r.run_dir / f)],
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              text=True))
                 for r in routers for f in plan.configs(r.name)]
        for name, fname, proc in procs:
            text, _ = proc.communicate(timeout=30)
            if proc.returncode != 0:
                raise TopologyError(f"routers.{name}", f"FRR rejects the generated {fname}: "
                                    f"{text.strip()}")
    procs2 = [(r, r.popen(["sh", "-c", scripts[r.name]], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)) for r in routers]
    failed = []
    for r, proc in procs2:
        out, _ = proc.communicate(timeout=60)
        # Record what did start even if a later daemon of this router failed.
        with contextlib.suppress(OSError, ValueError):
            r.register(record)
        if proc.returncode != 0:
            failed.append(f"{r.name}: {out.decode(errors='replace').strip()}")
    if failed:
        raise MachineError("frr", "daemons failed to start: " + "; ".join(failed))
    return time.monotonic() - t0


class BgpTopo(Topo):
    """A Mininet ``Topo`` whose routers run FRR; subclass it and declare in ``build()``.

    ::

        class Edge(BgpTopo):
            def build(self):
                self.addRouter("border1", asn=65000, maximum_paths=4)
                self.addRouter("isp1", asn=65001, networks=["198.51.100.0/24"])
                self.addBgpLink("border1", "isp1", "10.0.1.0/30")   # + an eBGP session
                self.addEndHost("cdn1")
                self.addBgpLink("isp1", "cdn1", ("198.51.100.1/24", "198.51.100.10/24"))

    ``self.bgp`` is the validated ``lab.net.bgp.BgpNetwork``: the single source of names,
    addresses and sessions for both Mininet and the generated FRR configs.
    """

    def __init__(self, *args: Any, **params: Any) -> None:
        self.bgp = BgpNetwork()
        super().__init__(*args, **params)
        self.bgp.validate()

    def addRouter(self, name: str, asn: int, **opts: Any) -> str:  # noqa: N802 - Mininet style
        r = self.bgp.add_router(name, asn, **opts)
        return self.addHost(name, cls=FrrRouter, ip=None, plan=r)

    def addEndHost(self, name: str, gateway: str | None = None) -> str:  # noqa: N802
        h = self.bgp.add_host(name, gateway=gateway)
        return self.addHost(name, cls=PlannedHost, ip=None, plan=h)

    def addBgpLink(self, a: str, b: str, *subnets: Subnet, bgp: bool = True,  # noqa: N802
                   bfd: bool = False, bw: float = 100.0, **opts: Any) -> str:
        link = self.bgp.add_link(a, b, *subnets, bgp=bgp, bfd=bfd, bw=bw)
        return self.addLink(a, b, port1=link.a_port, port2=link.b_port, cls=ShapedLink,
                            bw=link.bw, **opts)


class RouterNet:
    """A switchless Mininet network of FRR routers and end hosts, owned by one run record."""

    def __init__(self, topo: BgpTopo, run_dir: Path, record: state.RunRecord) -> None:
        self.topo = topo
        self.plan = topo.bgp
        self.run_dir = run_dir
        self.record = record
        self.net: Mininet | None = None
        self.timings: dict[str, float] = {}

    def interface_names(self) -> list[str]:
        return [i.name for n in (*self.plan.routers.values(), *self.plan.hosts.values())
                for i in n.interfaces]

    def build(self) -> None:
        """Create namespaces and links. Host-to-host veths are made inside the first node's
        namespace with the peer end in the second's, so the root namespace never holds one;
        names are still checked against it, since Mininet deletes same-named interfaces."""
        t0 = time.monotonic()
        setLogLevel("warning")
        _bridges, root_intfs = planned_names(self.topo)
        taken = sorted(set(self.interface_names()) & state.existing_interfaces())
        if taken:
            raise MachineError("topology", f"{', '.join(taken[:5])} already exist(s) in the "
                               "root namespace; if a killed run left them: fabriclab clean")
        self.record.interfaces = root_intfs
        self.record.save()
        self.net = Mininet(topo=self.topo, controller=None, link=ShapedLink, build=False,
                           autoSetMacs=False, autoStaticArp=False, waitConnected=False)
        try:
            self.net.build()
        finally:
            for node in self.net.hosts:
                if node.shell is not None and node.pid:
                    self.record.pids.append({"pid": node.pid,
                                             "start": state.proc_start_time(node.pid),
                                             "what": f"shell {node.name}"})
            self.record.save()
        self.timings["build_s"] = time.monotonic() - t0

    @property
    def routers(self) -> list[FrrRouter]:
        assert self.net is not None
        return [h for h in self.net.hosts if isinstance(h, FrrRouter)]

    def get(self, name: str) -> Any:
        assert self.net is not None
        return self.net.get(name)

    def start(self) -> None:
        self.timings["frr_start_s"] = start_routers(self.routers, self.plan, self.run_dir,
                                                    self.record)

    def wait_established(self, timeout: float = 10.0) -> float:
        t0 = time.monotonic()
        for r in self.routers:
            r.wait_established(max(0.1, timeout - (time.monotonic() - t0)))
        return time.monotonic() - t0

    def keep_logs(self, dest: Path) -> None:
        """Copy every daemon's log out of the run dir (which teardown removes)."""
        for log in self.run_dir.glob("*/*.log"):
            target = dest / log.parent.name
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(log, target / log.name)

    def stop(self) -> dict[str, int]:
        """Everything goes by record: daemons and shells by PID, the run dirs by path."""
        t0 = time.monotonic()
        left = state.remove(self.record)
        self.net = None
        self.timings["stop_s"] = time.monotonic() - t0
        return left


@contextlib.contextmanager
def router_session(topo: BgpTopo, label: str, lock_wait_s: float | None = None,
                   on_record: Callable[[state.RunRecord], None] | None = None,
                   ) -> Iterator[RouterNet]:
    """Lock, record, yield a built (not started) RouterNet; remove it by record on any exit.

    The lifecycle of every run (``lab.machine.state.run_session``), with teardown on normal
    exit, exceptions, Ctrl-C and SIGTERM; ``kill -9`` leaves the record for `clean`.
    """
    state.require_root()
    if not installed():
        raise MachineError("frr", "FRR is not installed (apt-get install frr; make setup)")
    for r in topo.bgp.routers.values():
        if r.hash_policy is not None:
            probe_hash_policy(r.hash_policy, f"routers.{r.name}.hash_policy")
    with state.run_session(label, lock_wait_s) as (record, work):
        shutil.chown(work, FRR_USER, FRR_USER)
        rnet = RouterNet(topo, work, record)
        try:
            if on_record is not None:
                on_record(record)
            with state.signals_as_exit():
                rnet.build()
                yield rnet
        finally:
            rnet.stop()
