"""The head's line to every other worker of a cluster: ssh, and the lab's agent at its end.

Mininet's cluster edition (``mininet.examples.cluster``) runs the emulated nodes on the
workers through ssh. What it leaves to its user is what FabricLab needs of each worker
besides: its own lock and run record (so its cleanup is by record, never ``mn -c``), its
counters read where they are, and its clock. That is the agent: ``fabriclab cluster agent
RUN_ID``, started over ssh for the length of one run, answering one JSON request per line on
its stdin. When the head goes away, even by ``kill -9``, the agent's stdin closes and it
removes everything its record lists; ``fabriclab clean --cluster`` applies what is left.

Every ssh the lab starts is non-interactive (``BatchMode``: a worker that wants a password
is refused, not prompted for) and keeps to the addresses in the cluster file.
"""

from __future__ import annotations

import base64
import contextlib
import json
import selectors
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from lab.model.cluster import ClusterError, WorkerSpec

T = TypeVar("T")

#: ssh's options for every connection the lab makes to a worker.
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
               "-o", "StrictHostKeyChecking=accept-new", "-o", "ServerAliveInterval=5",
               "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR")
#: What the agent is started as on a worker (the lab installed the way ``cluster setup`` did).
AGENT_COMMAND = ("fabriclab", "cluster", "agent")
#: Clock probes per offset measurement; the one with the shortest round trip is kept.
CLOCK_PROBES = 9


def ssh(dest: str, command: str, *, tty: bool = False, extra: tuple[str, ...] = ()) -> list[str]:
    """argv for running ``command`` (a shell line) on ``dest``."""
    return ["ssh", *SSH_OPTIONS, *(["-tt"] if tty else ["-T"]), *extra, dest, command]


def run(worker: WorkerSpec, command: str,
        timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run a shell line on ``worker`` (locally for the head) and return what it printed."""
    argv = ["bash", "-c", command] if worker.local else ssh(worker.ssh, command)
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"workers[{worker.name}]",
                           f"`{command[:60]}` did not finish within {timeout_s:.0f} s") \
            from None


def reachable(worker: WorkerSpec) -> None:
    """Refuse a worker that ssh cannot log in to without a password, naming the fix."""
    if worker.local:
        return
    out = run(worker, "true", timeout_s=30)
    if out.returncode != 0:
        why = (out.stderr.strip().splitlines() or ["no answer"])[-1]
        raise ClusterError(f"workers[{worker.name}].ssh",
                           f"cannot log in to {worker.ssh} without a password ({why}); "
                           "install the head's key there (ssh-copy-id) and check the address")


@dataclass
class ClockOffset:
    """A worker's monotonic clock against the head's: ``worker = head + offset_s``,
    known to within ``error_s`` (half the round trip of the best probe)."""

    offset_s: float
    error_s: float

    def as_dict(self) -> dict[str, float]:
        return {"offset_s": round(self.offset_s, 6), "error_ms": round(self.error_s * 1e3, 3)}


@dataclass(eq=False)          # one agent, one identity: measurements group ports by it
class Agent:
    """The lab's agent on one remote worker, for one run (see the module's doc)."""

    worker: WorkerSpec
    run_id: str
    proc: subprocess.Popen[str] | None = None
    hello: dict[str, Any] = field(default_factory=dict)
    #: One request at a time on the pipe: the sampler's thread and the run's share it.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def name(self) -> str:
        return self.worker.name

    def start(self, timeout_s: float = 120.0) -> dict[str, Any]:
        """Start the agent; it takes the worker's lock and opens its record, then says hello.

        A worker whose lab is busy, or that has no lab, is refused with one line naming it.
        """
        command = (f"env FABRICLAB_RUN={shlex.quote(self.run_id)} "
                   + " ".join(map(shlex.quote, (*AGENT_COMMAND, self.run_id))))
        self.proc = subprocess.Popen(ssh(self.worker.ssh, command), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1)
        self.hello = self._reply(timeout_s, "start")
        return self.hello

    def request(self, cmd: str, timeout_s: float = 120.0, **args: Any) -> dict[str, Any]:
        """One request, one reply; an error reply is a ClusterError naming the worker."""
        if self.proc is None or self.proc.stdin is None:
            raise ClusterError(f"workers[{self.name}]", "the agent is not running")
        with self.lock:
            try:
                self.proc.stdin.write(json.dumps({"cmd": cmd, **args}) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass                           # the reply read says what happened
            return self._reply(timeout_s, cmd)

    def _reply(self, timeout_s: float, what: str) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            if not sel.select(timeout_s):
                raise ClusterError(f"workers[{self.name}]",
                                   f"the agent did not answer `{what}` in {timeout_s:.0f} s")
        finally:
            sel.close()
        line = self.proc.stdout.readline()
        if not line:
            err = ""
            if self.proc.stderr is not None:
                self.proc.wait(timeout=10)
                err = self.proc.stderr.read().strip()
            last = (err.splitlines() or ["no output"])[-1]
            raise ClusterError(f"workers[{self.name}]", f"the agent stopped ({what}): {last}")
        reply = json.loads(line)
        if "error" in reply:
            raise ClusterError(reply.get("field") or f"workers[{self.name}]", reply["error"])
        return reply

    def clock(self) -> ClockOffset:
        """The worker's clock against this one's (NTP's method, best of several probes)."""
        best: tuple[float, float] | None = None
        for _ in range(CLOCK_PROBES):
            t1 = time.monotonic()
            theirs = float(self.request("clock")["mono"])
            t2 = time.monotonic()
            rtt = t2 - t1
            if best is None or rtt < best[1]:
                best = (theirs - (t1 + t2) / 2, rtt)
        assert best is not None
        return ClockOffset(best[0], best[1] / 2)

    def close(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Ask the agent to remove what its record lists and stop; then the ssh is gone."""
        reply: dict[str, Any] = {}
        if self.proc is None:
            return reply
        if self.proc.poll() is None:
            with contextlib.suppress(ClusterError):
                reply = self.request("exit", timeout_s=timeout_s)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        return reply


@dataclass
class Placement:
    """Where a running cluster's nodes are, and the agents of its remote workers: what the
    measurements need to read a node's counters where the node is."""

    head: str
    where: dict[str, str]
    agents: dict[str, Agent]
    offsets: dict[str, ClockOffset] = field(default_factory=dict)
    #: Per worker, its least idle second and the lab's own CPU on it over the run's
    #: judged windows (the least idle and the busiest of every window judged).
    fidelity: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def judged(self, worker: str, idle_min: float, lab_cpu: float | None) -> None:
        """Fold one judged window's numbers of ``worker`` into :attr:`fidelity`."""
        f = self.fidelity.setdefault(worker, {"cpu_idle_min_pct": idle_min,
                                              "lab_cpu_pct": lab_cpu})
        f["cpu_idle_min_pct"] = min(float(f["cpu_idle_min_pct"] or 0.0), idle_min)
        if lab_cpu is not None:
            f["lab_cpu_pct"] = max(float(f["lab_cpu_pct"] or 0.0), lab_cpu)

    def agent_of(self, node: str) -> Agent | None:
        """The agent of the worker ``node`` runs on; None for the head's own nodes."""
        return self.agents.get(self.where.get(node, ""))


_current: Placement | None = None


def node_of(name: str) -> str:
    """The node an interface belongs to (Mininet's ``s1-eth3`` -> ``s1``); a node's own
    name (a bridge's) is itself."""
    return name.rsplit("-eth", 1)[0]


def by_agent(items: Iterable[T], node: Callable[[T], str]) -> dict[Agent | None, list[T]]:
    """``items`` grouped by the agent of the worker their node is on (None: this
    machine's), so each group is read or changed where it is. On one machine: one group."""
    groups: dict[Agent | None, list[T]] = {}
    for item in items:
        agent = _current.agent_of(node(item)) if _current is not None else None
        groups.setdefault(agent, []).append(item)
    return groups


def current() -> Placement | None:
    """The running cluster's placement; None on one machine."""
    return _current


def set_current(placement: Placement | None) -> None:
    global _current
    _current = placement


def nic_counters(address: str) -> dict[str, int]:
    """Drop and error counters of the interface that holds ``address`` on this machine."""
    out = subprocess.run(["ip", "-j", "-s", "-o", "addr", "show", "to", f"{address}/32"],
                         capture_output=True, text=True, check=False).stdout
    names = [a.get("ifname") for a in json.loads(out or "[]")]
    if not names:
        return {}
    stats = subprocess.run(["ip", "-j", "-s", "link", "show", "dev", str(names[0])],
                           capture_output=True, text=True, check=False).stdout
    link = (json.loads(stats or "[]") or [{}])[0].get("stats64", {})
    return {f"{d}_{k}": int(link.get(d, {}).get(k, 0)) for d in ("rx", "tx")
            for k in ("dropped", "errors")}


def run_at(node: str, argv: list[str], input_text: str | None = None,
           timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in the root namespace of the machine ``node`` is on: this one, or, in a
    cluster, its worker's (through that worker's agent)."""
    agent = _current.agent_of(node) if _current is not None else None
    if agent is None:
        return subprocess.run(argv, input=input_text, capture_output=True, text=True,
                              check=False, timeout=timeout_s)
    got = agent.request("run", argv=argv, input=input_text, timeout=timeout_s,
                        timeout_s=timeout_s + 30)
    return subprocess.CompletedProcess(argv, int(got["rc"]), got["stdout"], got["stderr"])


def clock_offset_s(node: str) -> float:
    """How far the clock of the machine ``node`` is on runs ahead of the head's
    (``worker = head + offset``); 0 on this machine."""
    if _current is None or _current.agent_of(node) is None:
        return 0.0
    return _current.offsets[_current.where[node]].offset_s


def proc_net(node: Any, name: str) -> str:
    """A host's own ``/proc/net/<name>`` (its namespace's): read through ``/proc/<pid>`` on
    this machine, so nothing is spawned; through the host's shell on another worker."""
    if getattr(node, "isRemote", False):
        return str(node.cmd(f"cat /proc/net/{name}"))
    with open(f"/proc/{node.pid}/net/{name}") as f:
        return f.read()


def fetch(directory: Path) -> list[str]:
    """What programs on the other workers wrote under ``directory`` (the run's own, which
    each worker's agent keeps at the same path and removes), copied here where no file of
    that name is yet; returns the paths copied."""
    copied: list[str] = []
    for agent in (_current.agents.values() if _current is not None else ()):
        files = agent.request("fetch", path=str(directory))["files"]
        for rel, data in sorted(files.items()):
            target = directory / rel
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(base64.b64decode(data))
            copied.append(str(target))
    return copied
