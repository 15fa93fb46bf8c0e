"""Network namespaces of a test's own, joined by veths: the rig the mechanism tests (the
ECN marker, the RoCEv2 transport, the PFC engine) run their real packets on.

Why not the lab's fabric: each of those tests one mechanism on one or two shaped ports, and
a rig of a few namespaces shows it with nothing else moving. Every name holds the test's PID
and the rig's ``family`` and ``prefix``, so two tests (or two rigs of one test) never share
one; ``close`` kills what it started by PID and deletes exactly its namespaces (which
deletes their veths).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from lab.net.links import TSO_LIMIT


@dataclass(kw_only=True)
class NsRig:
    """``links`` are (x, y) pairs of short node names; link i (from 1) is
    ``{subnet}.i.0/24`` with x at .1 and y at .2; x's device is
    ``{family[:2]}<pid><prefix><x><y>`` (at most 15 characters with 2-character prefixes
    and nodes). ``routes`` are (node, prefix, via). Every node forwards (a switch or a
    router in the middle) and has IPv6 off (no router solicitations on the ports)."""

    links: list[tuple[str, str]]
    routes: list[tuple[str, str, str]]
    family: str                 # the test's: "ecnt", "rce", "pfct"
    subnet: str                 # "10.77"
    prefix: str = ""            # tells one test's rigs apart: "h1", "h2", ...
    tag: int = field(default_factory=os.getpid)
    namespaces: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)
    sleepers: dict[str, int] = field(default_factory=dict)

    def name(self, node: str) -> str:
        return f"{self.family}-{self.tag}-{self.prefix}{node}"

    def dev(self, node: str, peer: str) -> str:
        return f"{self.family[:2]}{self.tag}{self.prefix}{node}{peer}"

    def addr(self, node: str, peer: str) -> str:
        for i, (x, y) in enumerate(self.links, start=1):
            if (x, y) == (node, peer):
                return f"{self.subnet}.{i}.1"
            if (y, x) == (node, peer):
                return f"{self.subnet}.{i}.2"
        raise KeyError((node, peer))

    def ns(self, node: str, *argv: str, check: bool = True,
           timeout: float = 20) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(["nsenter", f"--net=/run/netns/{self.name(node)}", *argv],
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"{node}: {' '.join(argv)}: {r.stderr.strip()}")
        return r

    def spawn(self, node: str | None, *argv: str, **kw: object) -> subprocess.Popen:
        """A process in ``node``'s namespace (this one's for None); nsenter execs it, so the
        PID is the tool's and killing it by PID kills the tool."""
        pre = ["nsenter", f"--net=/run/netns/{self.name(node)}"] if node else []
        p = subprocess.Popen([*pre, *argv], **kw)
        self.procs.append(p)
        return p

    def start(self) -> None:
        """Namespaces, a sleeper in each (a PID to reach it by: ``count_wire_bytes``),
        veths with addresses and the lab's TSO limit, routes."""
        for node in sorted({n for pair in self.links for n in pair}):
            subprocess.run(["ip", "netns", "add", self.name(node)], check=True)
            self.namespaces.append(self.name(node))
            self.ns(node, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1")
            self.ns(node, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
            self.ns(node, "ip", "link", "set", "lo", "up")
            self.sleepers[node] = self.spawn(node, "sleep", "600").pid
        for i, (x, y) in enumerate(self.links, start=1):
            subprocess.run(["ip", "link", "add", self.dev(x, y), "netns", self.name(x),
                            "type", "veth", "peer", "name", self.dev(y, x), "netns",
                            self.name(y)], check=True)
            for node, peer, host in ((x, y, 1), (y, x, 2)):
                self.ns(node, "ip", "addr", "add", f"{self.subnet}.{i}.{host}/24", "dev",
                        self.dev(node, peer))
                self.ns(node, "ip", "link", "set", self.dev(node, peer),
                        *TSO_LIMIT.split(), "up")
        for node, prefix, via in self.routes:
            self.ns(node, "ip", "route", "add", prefix, "via", via)

    def close(self) -> None:
        try:
            for p in self.procs:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGKILL)
            for p in self.procs:
                p.wait(timeout=10)
        finally:  # deleting a namespace deletes its veth ends
            for name in self.namespaces:
                subprocess.run(["ip", "netns", "del", name], check=False)
        left = set(subprocess.run(["ip", "netns", "list"], capture_output=True,
                                  text=True).stdout.split())
        assert not left & set(self.namespaces), f"namespaces left behind: {self.namespaces}"

    def capture(self, node: str, intf: str, path: Path, *args: str) -> subprocess.Popen:
        """tcpdump on ``intf`` into ``path`` (``args``: more options, a filter), returned once
        it captures (it says "listening on"); stop it with ``stop``."""
        proc = self.spawn(node, "tcpdump", "-i", intf, "-U", "-Z", "root", "-w", str(path),
                          *args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while True:
            ready, _, _ = select.select([proc.stderr], [], [], 0.2)
            if ready and "listening on" in proc.stderr.readline():
                return proc
            assert proc.poll() is None, "tcpdump exited"
            assert time.monotonic() < deadline, "tcpdump did not start capturing"

    @staticmethod
    def stop(proc: subprocess.Popen) -> None:
        """SIGTERM to a process of the rig, by PID, and its exit."""
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)

    def tc_json(self, node: str, dev: str, what: str) -> list[dict]:
        """``tc -s -j WHAT show dev DEV`` in ``node``'s namespace."""
        return json.loads(self.ns(node, "tc", "-s", "-j", what, "show", "dev", dev).stdout)


@dataclass(kw_only=True)
class LineRig(NsRig):
    """A - S - B: a sender, a switch (its port towards B is the one a test shapes) and a
    receiver, with A's and B's default routes through S."""

    links: list[tuple[str, str]] = field(default_factory=lambda: [("a", "s"), ("s", "b")])
    routes: list[tuple[str, str, str]] = field(default_factory=list)
    # the nodes by their roles
    ns_a, ns_s, ns_b = "a", "s", "b"

    def __post_init__(self) -> None:
        if not self.routes:
            self.routes = [("a", "default", self.addr("s", "a")),
                           ("b", "default", self.addr("s", "b"))]

    @property
    def if_sa(self) -> str:
        return self.dev("s", "a")

    @property
    def if_sb(self) -> str:
        return self.dev("s", "b")

    @property
    def if_b(self) -> str:
        return self.dev("b", "s")

    @property
    def ip_a(self) -> str:
        return self.addr("a", "s")

    @property
    def ip_b(self) -> str:
        return self.addr("b", "s")
