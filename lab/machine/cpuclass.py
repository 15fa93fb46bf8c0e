"""CPU classes: the datapath gets the CPU first.

Every number a run reports depends on the switches forwarding on time, and on two cores
the datapath (``ovs-vswitchd``'s threads, the kernel's softirq) shares the CPU with what
the lab starts in the hosts: traffic generators, collective ranks, media servers, players,
a browser. Those run under the kernel's CPU controller in one group per run, an idle group
(``cpu.idle``; a quarter of a nice-0 task's weight where the kernel lacks it), with a group
per class inside it, so that when the CPU is short the datapath waits least. The
controller is work-conserving: it matters only while the CPU is contended, so a run with
CPU to spare runs as it did without it.

Mechanisms, as the kernel offers them: cgroup v1's ``cpu`` (with ``cpuacct`` for each
class's CPU time), or cgroup v2's ``cpu``; with neither, ``none`` (recorded).

Not Mininet's ``CPULimitedHost``: it groups by host, and a host runs programs of several
classes (an iperf3 sender beside a gloo rank); it names its groups by host name, which
another user's Mininet on the same machine shares; and its limit is a CFS quota, a hard cap
that leaves a core idle rather than lend it.

Each class's group is written into the run's record before it is made, so an interrupted
run's groups go with its other leftovers (``lab.machine.state.remove``).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: A nice-0 task's weight in cgroup v1's ``cpu.shares`` (cgroup v2's ``cpu.weight``: 100).
NICE0_SHARES = 1024
#: The weight of all the programs of a run together, against one of the datapath's threads
#: (a nice-0 task), where the kernel has no idle groups: a quarter. Measured (2 cores, a load
#: at this weight standing for the lab's programs, bench/fidelity_threshold.py): the
#: datapath still waited 90-260 ms a second for a CPU, against 22-42 unloaded.
LAB_SHARES = 256
#: The classes and their weights relative to each other inside the run's group. The
#: offered load and the collective ranks first: their starving changes the traffic itself.
CLASS_SHARES: dict[str, int] = {
    "traffic": 1024,    # iperf3, stream senders, micro-bursts
    "ranks": 1024,      # collective ranks (ring, incast, gloo, DDP) and their data loaders
    "storage": 512,     # storage servers and checkpoint clients
    "media": 512,       # media servers (nginx-rtmp) and their pushers (ffmpeg)
    "players": 512,     # RTMP and HLS viewers
    "browser": 256,     # headless Chromium playing hls.js
    "routers": 1024,    # FRR's daemons in the routers (the emulated control plane)
}
#: Classes whose waiting for a CPU changes the traffic itself (a sender that cannot send):
#: a run says so when they waited past the datapath's line.
TRAFFIC_CLASSES = ("traffic", "ranks")


def v2_weight(shares: int) -> int:
    """cgroup v2's ``cpu.weight`` for a v1 ``cpu.shares`` (100 is a nice-0 task's)."""
    return max(1, min(10000, round(shares * 100 / NICE0_SHARES)))


@dataclass(frozen=True)
class Mechanism:
    """Where this kernel's CPU controller is, and how a group's weight is written."""

    name: str                    # "cgroup1 cpu.shares" | "cgroup2 cpu.weight" | "none"
    cpu: Path | None             # the hierarchy with the cpu controller
    acct: Path | None            # the hierarchy with per-group CPU time (v1: cpuacct)

    @property
    def v2(self) -> bool:
        return self.name.startswith("cgroup2")


def mechanism(root: Path = CGROUP_ROOT) -> Mechanism:
    """The CPU controller this machine has: v1's ``cpu`` hierarchy if mounted (this
    machine, where cgroup2 has no controllers), else a cgroup2 hierarchy offering ``cpu``."""
    v1 = root / "cpu"
    if (v1 / "cpu.shares").exists():
        acct = root / "cpuacct"
        if (v1 / "cpuacct.usage").exists():       # co-mounted cpu,cpuacct
            acct = v1
        return Mechanism("cgroup1 cpu.shares", v1,
                         acct if (acct / "cpuacct.usage").exists() else None)
    # A v2 group gets cpu.weight only where its parent enables the controller for its
    # children; the lab does not change that at the hierarchy's root, which is the machine's.
    for v2 in (root, root / "unified"):
        with contextlib.suppress(OSError):
            if "cpu" in (v2 / "cgroup.subtree_control").read_text().split():
                return Mechanism("cgroup2 cpu.weight", v2, v2)
    return Mechanism("none", None, None)


class Recorder(Protocol):
    """What keeps a run's leftovers (``lab.machine.state.RunRecord``)."""

    cgroups: list[str]

    def save(self) -> None: ...


def thread_wait_ns(tid_paths: list[str]) -> int:
    """Run-queue wait so far, summed over threads (``/proc/.../schedstat``'s second field:
    nanoseconds a runnable thread waited for a CPU); a thread gone meanwhile counts 0."""
    total = 0
    for p in tid_paths:
        try:
            with open(p, "rb") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total


class CpuClasses:
    """A run's CPU classes: one group per class under the run's own group, made on first
    use, removed at the end of the run with the rest of its record."""

    def __init__(self, run_id: str, record: Recorder,
                 mech: Mechanism | None = None) -> None:
        self.mech = mech if mech is not None else mechanism()
        self.record = record
        self.name = f"fabriclab-{run_id}"
        self.made: dict[str, Path] = {}
        #: How the run's group is weighed against the datapath (``weigh_run_group``).
        self.run_weight = ""
        #: Classes whose group could not be made or joined, with the kernel's reason.
        self.errors: dict[str, str] = {}

    @property
    def _bases(self) -> list[Path]:
        """The hierarchies a group is made in: the CPU controller's, and cpuacct's where
        that is mounted apart (cgroup v1 here)."""
        return [b for b in dict.fromkeys((self.mech.cpu, self.mech.acct)) if b is not None]

    def _group(self, base: Path, cls: str | None) -> Path:
        return base / self.name if cls is None else base / self.name / cls

    def _make(self, cls: str) -> Path | None:
        """The class's group (and the run's, the first time), written into the record
        before it exists."""
        if cls in self.made:
            return self.made[cls]
        assert self.mech.cpu is not None
        new = [self._group(b, c) for c in (None, cls) for b in self._bases
               if not self._group(b, c).exists()]
        self.record.cgroups.extend(str(p) for p in new if str(p) not in self.record.cgroups)
        self.record.save()
        top = self._group(self.mech.cpu, None)
        try:
            for p in new:
                p.mkdir()
            if top in new:
                self.run_weight = weigh_run_group(top, self.mech)
                if self.mech.v2:
                    (top / "cgroup.subtree_control").write_text("+cpu")
            self._weigh(self._group(self.mech.cpu, cls), CLASS_SHARES[cls])
        except OSError as e:
            self.errors[cls] = f"{e.strerror or e}"
            return None
        self.made[cls] = self._group(self.mech.cpu, cls)
        return self.made[cls]

    def _weigh(self, group: Path, shares: int) -> None:
        if self.mech.v2:
            (group / "cpu.weight").write_text(str(v2_weight(shares)))
        else:
            (group / "cpu.shares").write_text(str(shares))

    def add(self, pid: int, cls: str) -> None:
        """Move ``pid`` (and so whatever it starts afterwards) into class ``cls``.

        A program moved just after it started has run a few milliseconds in its parent's
        group; what it forks from then on is born in its class. A process that exited in
        between is not an error.
        """
        if cls not in CLASS_SHARES:
            raise ValueError(f"unknown CPU class {cls!r} (known: {', '.join(CLASS_SHARES)})")
        if self.mech.cpu is None or self._make(cls) is None:
            return
        for b in self._bases:
            try:
                (self._group(b, cls) / "cgroup.procs").write_text(str(pid))
            except ProcessLookupError:
                return
            except OSError as e:
                self.errors[cls] = f"{e.strerror or e}"

    def usage_ns(self) -> dict[str, int]:
        """{class: CPU nanoseconds so far} of the classes used (their live and dead tasks)."""
        out = {}
        for cls in self.made:
            with contextlib.suppress(OSError, ValueError, StopIteration):
                if self.mech.v2:
                    stat = (self._group(self.mech.cpu, cls) / "cpu.stat").read_text()
                    usec = next(ln for ln in stat.splitlines() if ln.startswith("usage_usec"))
                    out[cls] = int(usec.split()[1]) * 1000
                elif self.mech.acct is not None:
                    out[cls] = int((self._group(self.mech.acct, cls)
                                    / "cpuacct.usage").read_text())
        return out

    def waiting(self) -> dict[str, tuple[int, int]]:
        """{class: (run-queue wait so far summed over its live threads, how many programs)}.
        A thread that has exited takes its wait with it: what a class waited is read every
        second and summed from differences, so at most its last second is lost."""
        out = {}
        for cls, group in self.made.items():
            try:
                tids = (group / ("cgroup.threads" if self.mech.v2 else "tasks")).read_text()
            except OSError:
                continue
            try:
                procs = len((group / "cgroup.procs").read_text().split())
            except OSError:
                procs = 0
            out[cls] = (thread_wait_ns([f"/proc/{t}/schedstat" for t in tids.split()]), procs)
        return out

    def describe(self) -> dict[str, object]:
        """What a result says of the classes: the mechanism and the weights in force."""
        out: dict[str, object] = {
            "mechanism": self.mech.name,
            "run_group": self.run_weight, "nice0_shares": NICE0_SHARES,
            "class_shares": {c: CLASS_SHARES[c] for c in self.made}}
        if self.errors:
            out["errors"] = dict(self.errors)
        return out


def weigh_run_group(group: Path, mech: Mechanism) -> str:
    """Put a run's group below every nice-0 task, the datapath's threads among them; says
    how: ``idle`` (the kernel's ``cpu.idle``: the group's tasks run only on a CPU no normal
    task wants, and a waking normal task preempts them at once, as ``SCHED_IDLE`` does for
    one task) where the kernel has it, else ``shares N`` (a weight, a quarter of a nice-0
    task's: it lowers the group's share, not how long a waking datapath thread waits).
    Inside the group, the classes still share by their weights."""
    if (group / "cpu.idle").exists():
        (group / "cpu.idle").write_text("1")
        return "idle"
    if mech.v2:
        (group / "cpu.weight").write_text(str(v2_weight(LAB_SHARES)))
    else:
        (group / "cpu.shares").write_text(str(LAB_SHARES))
    return f"shares {LAB_SHARES}"


def remove_groups(paths: list[str]) -> None:
    """Remove a run's recorded groups, deepest first, once their processes are gone.

    A group that still has a process (one the run did not start, moved in by hand) stays,
    and so does any group that is not empty of others; rmdir refuses both.
    """
    for p in sorted(paths, key=lambda s: s.count("/"), reverse=True):
        with contextlib.suppress(FileNotFoundError, OSError):
            os.rmdir(p)
