"""CPU classes on this kernel's CPU controller: a program the lab starts joins its class, the
datapath's weight wins over it when the CPU is contended, its CPU is counted, and the groups
go with the run's record."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.machine import cpuclass, state

SPIN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"


@pytest.fixture
def classes():
    if cpuclass.mechanism().cpu is None:
        pytest.skip("this kernel has no CPU controller mounted")
    record = state.RunRecord.new(f"test-cpuclass-{os.getpid()}-{time.time_ns()}")
    yield cpuclass.CpuClasses(record.run_id, record), record
    state.remove(record)


def spin(seconds: float, cpu: int | None = None) -> subprocess.Popen:
    pre = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    return subprocess.Popen([sys.executable, "-c", SPIN.format(s=seconds)], preexec_fn=pre)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_program_joins_its_class_under_the_runs_group_at_a_lower_weight(classes):
    cls, record = classes
    proc = spin(1.0)
    record.add_pid(proc.pid, "spinner")
    cls.add(proc.pid, "traffic")
    group = cls.mech.cpu / cls.name
    assert str(proc.pid) in (group / "traffic" / "cgroup.procs").read_text().split()
    if (group / "cpu.idle").exists():             # this kernel: an idle group
        assert (group / "cpu.idle").read_text().strip() == "1"
        assert cls.run_weight == "idle"
    else:
        assert cls.run_weight == f"shares {cpuclass.LAB_SHARES}"
    # Every group made is in the record before the run ends (kill -9 leaves them to clean).
    assert str(group) in record.cgroups and str(group / "traffic") in record.cgroups
    proc.wait()
    used = cls.usage_ns()["traffic"]
    assert used > 0.5e9, used               # its second of spinning, counted in its class
    assert cls.describe()["mechanism"] == cls.mech.name


def test_an_unknown_class_is_refused_by_name(classes):
    cls, _ = classes
    with pytest.raises(ValueError, match="'nope'"):
        cls.add(os.getpid(), "nope")
    assert not cls.made


def test_on_a_shared_cpu_the_datapaths_weight_wins(classes):
    """Two spinners on one CPU, one at a nice-0 task's weight (as ovs-vswitchd runs), one in
    a class: the class gets at most a quarter of the nice-0 task's share (LAB_SHARES; an
    idle group next to nothing), measured, with room for the scheduler's granularity."""
    cls, record = classes
    cpu = min(os.sched_getaffinity(0))
    lab, dp = spin(3.0, cpu), spin(3.0, cpu)
    record.add_pid(lab.pid, "class spinner")
    record.add_pid(dp.pid, "datapath-like spinner")
    cls.add(lab.pid, "traffic")
    time.sleep(2.5)
    got = {"class": cpu_s(lab.pid), "nice-0": cpu_s(dp.pid)}
    lab.wait()
    dp.wait()
    assert got["nice-0"] > 2 * got["class"], got


def test_removing_the_record_removes_the_groups(classes):
    cls, record = classes
    proc = subprocess.Popen(["sleep", "30"])
    record.add_pid(proc.pid, "sleeper")
    cls.add(proc.pid, "media")
    assert (cls.mech.cpu / cls.name / "media").is_dir()
    state.remove(record)
    proc.wait(timeout=5)
    assert not (cls.mech.cpu / cls.name).exists()
    if cls.mech.acct is not None:
        assert not (cls.mech.acct / cls.name).exists()
