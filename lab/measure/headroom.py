"""When a window's numbers describe the network: the CPU the emulation had, read from the
whole machine (idle per second) and from the datapath itself (its threads' run-queue wait,
softirq), and the one verdict every kind applies to every phase (docs/fidelity.md).
"""

from __future__ import annotations

import contextlib
import os
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
CPU_FIELDS = ("datapath_wait_ms", "datapath_wait_max_ms", "softirq_pct", "softirq_max_pct",
              "cpu_classes")


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


class DatapathThreads:
    """The threads a packet waits for when the CPU is short: ``ovs-vswitchd``'s (it
    forwards every packet of the userspace datapath, and handles the kernel datapath's
    upcalls) and the kernel's softirq threads (``ksoftirqd/N``, where softirq work goes once
    it is deferred). Their run-queue wait (``/proc/.../schedstat``) is how long the datapath
    was ready to forward and had no CPU: the emulator falling behind, measured where it
    happens, whatever else is busy.
    """

    def __init__(self, pidfile: str = VSWITCHD_PIDFILE) -> None:
        try:
            self.vswitchd: int | None = int(Path(pidfile).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            self.vswitchd = None
        #: Kernel threads are found once: they live as long as the machine.
        self.softirqd = [f"/proc/{pid}/schedstat" for pid in _kernel_threads("ksoftirqd/")]

    def paths(self) -> list[str]:
        """Every datapath thread's schedstat file (vswitchd's threads listed anew: its
        handler and revalidator threads come and go with its configuration)."""
        out = list(self.softirqd)
        if self.vswitchd is not None:
            with contextlib.suppress(OSError):
                out += [f"/proc/{self.vswitchd}/task/{t}/schedstat"
                        for t in os.listdir(f"/proc/{self.vswitchd}/task")]
        return out

    def wait_ns(self) -> int:
        """Their run-queue wait so far, summed."""
        return cpuclass.thread_wait_ns(self.paths())


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
