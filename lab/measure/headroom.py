"""When a window's numbers describe the network: the CPU the emulation had, read from the
whole machine (idle per second) and from the datapath itself (its threads' run-queue wait,
softirq), and the one verdict every kind applies to every phase (docs/fidelity.md).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.machine import cpuclass

#: The whole machine's idle line, the lab's first rule: a window whose least idle second had
#: less CPU to spare than this ran CPU-bound. Measured on the 2-core machine
#: (bench/fidelity_threshold.py, docs/fidelity.md): it calls valid runs that drifted (at
#: 26-45 % idle under another user's load) and invalid runs that did not (7 % idle, the
#: lab's own programs busy in their idle group). Still the rule where the datapath's waiting
#: is not measured (a cluster's other workers), and reported beside it everywhere.
MIN_CPU_IDLE_PCT = 25.0
#: The datapath's threads' run-queue wait, in ms per second (worst second), past which the
#: emulation fell behind: the rule in force. Measured (docs/fidelity.md): every drifted run
#: waited 139 ms/s or more, every unloaded run 20-44, and runs whose CPU the lab's own
#: programs took (5-33 % idle) 25-98 with no step time drifting.
MAX_DATAPATH_WAIT_MS = 100.0
#: What a judged window keeps of the CPU beyond the idle line: the datapath's waiting and
#: the classes' CPU (``Sampler.datapath_numbers``).
CPU_FIELDS = ("datapath_wait_ms", "datapath_wait_max_ms", "datapath_wait_asleep_ms",
              "softirq_pct", "softirq_max_pct", "cpu_classes")


def cpu_fields(judged: dict[str, Any]) -> dict[str, Any]:
    """The datapath and class numbers of a judged window, as a result keeps them."""
    return {k: judged[k] for k in CPU_FIELDS if k in judged}


def cpu_verdict(judged: dict[str, Any]) -> str | None:
    """Why a judged window's numbers describe the emulator rather than the network (None:
    they describe the network): the one rule every kind applies to every phase.

    The datapath's own waiting where it was measured: how long its threads were ready to
    forward and had no CPU, whoever took it. Else (no datapath threads seen) the whole
    machine's idle line.
    """
    waits = judged.get("datapath_wait_ms")
    if waits:
        worst = float(judged.get("datapath_wait_max_ms") or max(waits))
        if worst > MAX_DATAPATH_WAIT_MS:
            return (f"CPU-bound: the datapath waited {worst:.0f} ms for a CPU in its worst "
                    f"second (> {MAX_DATAPATH_WAIT_MS:g} ms)")
        return None
    idle_min = float(judged["cpu_idle_min_pct"])
    if idle_min < MIN_CPU_IDLE_PCT:
        return (f"CPU-bound: least idle second had {idle_min:.0f}% idle "
                f"(< {MIN_CPU_IDLE_PCT:g}%)")
    return None


def starved_notes(judged: dict[str, Any]) -> list[str]:
    """Classes whose waiting for a CPU changes the traffic itself (a sender that cannot
    send), where each of their programs waited, on average, longer than the datapath may
    (``MAX_DATAPATH_WAIT_MS``): said, with the numbers. Per program, because a class's
    many programs (128 iperf3 at k=8) each wait a little at every wake-up, and their sum
    says nothing of any one sender. A note, not a verdict: how late a sender may be
    depends on the program (unloaded, incast ranks waited 11-14 ms/s, ring ranks 15-38,
    gloo ranks 32-55: docs/fidelity.md)."""
    out = []
    for cls, c in (judged.get("cpu_classes") or {}).items():
        per_program_ms = c["wait_pct"] * 10 / max(1, c.get("programs", 1))
        if cls in cpuclass.TRAFFIC_CLASSES and per_program_ms > MAX_DATAPATH_WAIT_MS:
            out.append(f"{cls}: its {c.get('programs', '?')} programs each waited for a CPU "
                       f"{per_program_ms:.0f} ms a second on average (the class used "
                       f"{c['cpu_pct']:.0f}% of a core): they may have sent less than "
                       "offered, or later")
    return out


def proc_stat() -> tuple[int, int, int]:
    """(idle, total, softirq) jiffies over all CPUs, from /proc/stat's first line."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return idle, sum(fields[:8]), fields[6] if len(fields) > 6 else 0


def cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies over all CPUs, from /proc/stat."""
    idle, total, _ = proc_stat()
    return idle, total


#: Where Open vSwitch keeps the PID of ``ovs-vswitchd``, the userspace datapath's forwarder.
VSWITCHD_PIDFILE = "/var/run/openvswitch/ovs-vswitchd.pid"


@dataclass
class ThreadReading:
    """One thread's scheduler numbers at a read, and when it was last seen not runnable."""

    run_ns: int          # time on a CPU so far (schedstat's first field)
    wait_ns: int         # run-queue wait so far, as the kernel charged it (its second)
    last_asleep: float   # the latest read time at which it was not runnable (state not R)


def credible_wait(prev: ThreadReading, run_ns: int, wait_ns: int, now: float) -> int:
    """How much of a thread's run-queue wait charged since ``prev`` it can have waited.

    The kernel charges a wait when the thread next gets a CPU. A thread seen asleep at
    ``prev.last_asleep`` cannot have waited longer than the time since, less what it ran
    meanwhile. Measured on this kernel (6.18): an OVS revalidator seen asleep was charged
    497 ms within 10 ms, about the 500 ms it sleeps between rounds, while both cores ran
    only idle-priority work; the scheduler counted its sleep as waiting. Real waits fit the
    bound: a thread truly waiting is runnable at every read meanwhile."""
    charged = max(0, wait_ns - prev.wait_ns)
    room = round((now - prev.last_asleep) * 1e9) - max(0, run_ns - prev.run_ns)
    return min(charged, max(0, room))


class DatapathThreads:
    """The threads a packet waits for when the CPU is short: ``ovs-vswitchd``'s (it
    forwards every packet of the userspace datapath, and handles the kernel datapath's
    upcalls) and the kernel's softirq threads (``ksoftirqd/N``, where softirq work goes once
    it is deferred). Their run-queue wait (``/proc/.../schedstat``) is how long the datapath
    was ready to forward and had no CPU: the emulator falling behind, measured where it
    happens, whatever else is busy. Only the wait a thread can have had counts
    (``credible_wait``); what the kernel charged beyond it is kept apart (``asleep_ns``).
    """

    def __init__(self, pidfile: str = VSWITCHD_PIDFILE) -> None:
        try:
            self.vswitchd: int | None = int(Path(pidfile).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            self.vswitchd = None
        #: Kernel threads are found once: they live as long as the machine.
        self.softirqd = [f"/proc/{pid}" for pid in _kernel_threads("ksoftirqd/")]
        self.threads: dict[str, ThreadReading] = {}
        self.last_read: float | None = None
        #: Credible wait and wait charged beyond it, summed over threads since the first read.
        self.total_ns = 0
        self.asleep_ns = 0

    def dirs(self) -> list[str]:
        """Every datapath thread's /proc directory (vswitchd's threads listed anew: its
        handler and revalidator threads come and go with its configuration)."""
        out = list(self.softirqd)
        if self.vswitchd is not None:
            with contextlib.suppress(OSError):
                out += [f"/proc/{self.vswitchd}/task/{t}"
                        for t in os.listdir(f"/proc/{self.vswitchd}/task")]
        return out

    def wait_ns(self, now: float | None = None) -> int:
        """Their credible run-queue wait since the first read, summed (it never decreases:
        a thread that exits keeps what it waited, one that starts adds what it waits)."""
        now = time.monotonic() if now is None else now
        seen: dict[str, ThreadReading] = {}
        for d in self.dirs():
            try:
                with open(f"{d}/schedstat", "rb") as f:
                    run_ns, wait_ns = (int(x) for x in f.read().split()[:2])
                with open(f"{d}/stat", "rb") as f:
                    runnable = f.read().rsplit(b")", 1)[1].split()[0] == b"R"
            except (OSError, IndexError, ValueError):
                continue
            prev = self.threads.get(d)
            if prev is None and self.last_read is not None:
                # Started since the last read: all its wait is since then.
                prev = ThreadReading(0, 0, self.last_read)
            if prev is not None:
                credible = credible_wait(prev, run_ns, wait_ns, now)
                self.total_ns += credible
                self.asleep_ns += max(0, wait_ns - prev.wait_ns) - credible
            asleep = now if not runnable else (prev.last_asleep if prev is not None else now)
            seen[d] = ThreadReading(run_ns, wait_ns, asleep)
        self.threads = seen
        self.last_read = now
        return self.total_ns


def _kernel_threads(prefix: str) -> list[int]:
    """PIDs of the kernel threads whose name starts with ``prefix`` (children of kthreadd,
    PID 2: nothing of a user's can be one)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        if name.startswith(prefix) and stat.rsplit(")", 1)[1].split()[1] == "2":
            found.append(int(entry))
    return found
