"""What a run created, written down before it is created, so it can be removed by record.

The lab never cleans by name (no ``mn -c``, no ``pkill``): other people's bridges and
processes on the same machine must survive a FabricLab run. Instead every run keeps a record
under the state directory listing the OVS bridges and root-namespace interfaces it will
create (checked to be free beforehand), the PIDs it starts (with their start times, so a
recycled PID is never killed) and its run id, which every process it spawns carries in its
environment as ``FABRICLAB_RUN``. ``fabriclab clean`` applies the records of runs whose
owner is gone (e.g. after ``kill -9``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lab.machine import cpuclass
from lab.model.errors import BusyError, MachineError

STATE_DIR = Path(os.environ.get("FABRICLAB_STATE", "/run/fabriclab"))
RUN_ENV = "FABRICLAB_RUN"
LOCK_WAIT_ENV = "FABRICLAB_LOCK_WAIT"



def require_root(command: str = "fabriclab",
                 why: str = "it creates namespaces, veths and OVS bridges") -> None:
    """Refuse early, before anything is started, unless running as root."""
    if os.geteuid() != 0:
        raise MachineError("user", f"{command} must run as root: {why} "
                           f"(try: sudo {command} ...)")



@contextlib.contextmanager
def run_session(label: str, lock_wait_s: float | None = None,
                ) -> Iterator[tuple[RunRecord, Path]]:
    """The lifecycle every run shares: the lab's lock (waiting up to ``lock_wait_s`` for
    another run; by default as long as ``$FABRICLAB_LOCK_WAIT`` says, as ``LabLock`` reads
    it), a record written before anything exists, and the run marker in the environment of
    every process started; yields the record and the run's work directory.

    The caller builds inside and tears down by the record before this lets go of the lock;
    ``kill -9`` leaves the record for ``fabriclab clean``.
    """
    lock = LabLock()
    lock.acquire(lock_wait_s)
    run_id = f"{label}-{int(time.time() * 1000)}-{os.getpid()}"
    # Every process the lab spawns inherits this marker: `clean` finds them by it.
    os.environ[RUN_ENV] = run_id
    try:
        record = RunRecord.new(run_id)
        work = STATE_DIR / "work" / run_id
        record.paths.append(str(work))
        record.save()
        work.mkdir(parents=True, exist_ok=True)
        yield record, work
    finally:
        lock.release()
        os.environ.pop(RUN_ENV, None)


@contextlib.contextmanager
def signals_as_exit() -> Iterator[None]:
    """SIGTERM and SIGHUP unwind the stack like Ctrl-C does, so a run's teardown runs."""
    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)
    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def records_dir() -> Path:
    return STATE_DIR / "runs"


def proc_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[19])


def pid_alive(pid: int, start: int | None) -> bool:
    """Running (not a zombie) and, when ``start`` is given, the same process as recorded."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):      # dead, waiting to be reaped by its parent
        return False
    return start is None or int(fields[19]) == start


@dataclass
class RunRecord:
    run_id: str
    owner_pid: int
    owner_start: int | None
    created: float = field(default_factory=time.time)
    bridges: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    pids: list[dict[str, object]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    #: CPU-controller groups the run made (``lab.machine.cpuclass``), removed after its
    #: processes.
    cgroups: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return records_dir() / f"{self.run_id}.json"

    def save(self) -> None:
        records_dir().mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, self.path)

    def add_pid(self, pid: int, what: str) -> None:
        self.pids.append({"pid": pid, "start": proc_start_time(pid), "what": what})
        self.save()

    def owner_alive(self) -> bool:
        return pid_alive(self.owner_pid, self.owner_start)

    @classmethod
    def load(cls, path: Path) -> RunRecord:
        return cls(**json.loads(path.read_text()))

    @classmethod
    def new(cls, run_id: str) -> RunRecord:
        pid = os.getpid()
        rec = cls(run_id=run_id, owner_pid=pid, owner_start=proc_start_time(pid))
        rec.save()
        return rec


class LabLock:
    """One run at a time: switch and interface names are fixed, so runs must take turns.

    ``flock`` is released by the kernel when the holder dies, even by ``kill -9``.
    """

    def __init__(self) -> None:
        self.fd: int | None = None

    def acquire(self, wait_s: float | None = None) -> None:
        """Take the lock; wait up to ``wait_s`` (default: ``$FABRICLAB_LOCK_WAIT`` seconds,
        else 0) for another run to finish, so a queue of CI jobs or a class's scripts can
        take turns instead of failing.

        ``wait_s=math.inf`` blocks in the kernel instead of polling: the kernel wakes a
        blocked waiter the instant the holder dies, ahead of any polling one (a test that
        kills a run takes the next turn itself, before another run starts on its leftovers).
        """
        if wait_s is None:
            try:
                wait_s = max(0.0, float(os.environ.get(LOCK_WAIT_ENV, "0") or 0))
            except ValueError:
                raise BusyError(LOCK_WAIT_ENV, "expected a number of seconds, got "
                                f"{os.environ[LOCK_WAIT_ENV]!r}") from None
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        path = STATE_DIR / "lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if math.isinf(wait_s):
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            _poll_lock(fd, wait_s)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def lock_held() -> bool:
    """Whether a run holds the lab's lock now (this process does not take it)."""
    path = STATE_DIR / "lock"
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _poll_lock(fd: int, wait_s: float) -> None:
    """Try for the lock every 0.2 s for ``wait_s``; then name the holder and give up."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise BusyError("lab", f"another FabricLab run (pid {holder}) is using the lab; "
                            f"wait for it (or set {LOCK_WAIT_ENV}=SECONDS), or stop it") \
                from None


def marked_pids(run_id: str) -> list[int]:
    """PIDs whose environment carries ``FABRICLAB_RUN=<run_id>`` (all our descendants)."""
    needle = f"{RUN_ENV}={run_id}".encode()
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def _kill(pids: list[tuple[int, int | None]], grace: float = 1.0,
          hard: frozenset[int] = frozenset()) -> int:
    """SIGTERM, then SIGKILL after ``grace`` seconds; only PIDs whose start time matches.

    PIDs in ``hard`` get SIGKILL at once: Mininet's node shells are interactive bash,
    which ignores SIGTERM, so waiting for them would only add the grace period.
    """
    alive = [(p, s) for p, s in pids if pid_alive(p, s)]
    for pid, _ in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL if pid in hard else signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(pid_alive(p, s) for p, s in alive):
        time.sleep(0.05)
    for pid, start in alive:
        if pid_alive(pid, start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return len(alive)


def existing_bridges() -> set[str]:
    out = subprocess.run(["ovs-vsctl", "--timeout=5", "list-br"], capture_output=True,
                         text=True)
    return set(out.stdout.split()) if out.returncode == 0 else set()


def existing_interfaces() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def remove(record: RunRecord) -> dict[str, int]:
    """Remove everything ``record`` lists that still exists; then the record itself."""
    pids = [(int(p["pid"]), p.get("start")) for p in record.pids]  # type: ignore[arg-type]
    shells = frozenset(int(p["pid"]) for p in record.pids  # type: ignore[arg-type]
                       if str(p.get("what", "")).startswith("shell "))
    pids += [(p, proc_start_time(p)) for p in marked_pids(record.run_id)]
    bridges = sorted(set(record.bridges) & existing_bridges())
    del_br = None
    if bridges:
        # ovs-vsctl waits until ovs-vswitchd has really removed them (~70 ms a bridge on the
        # userspace datapath): let it run while the processes and veths go.
        cmd = ["ovs-vsctl", "--timeout=20"]
        for br in bridges:
            cmd += ["--", "--if-exists", "del-br", br]
        del_br = subprocess.Popen(cmd)
    killed = _kill(list(dict.fromkeys(pids)), hard=shells)
    # Killing a host's shell frees its namespace and the veth ends inside it; switch-to-switch
    # veths live in the root namespace and go here.
    gone = existing_interfaces()
    intfs = [i for i in record.interfaces if i in gone]
    if intfs:
        batch = "".join(f"link del {i}\n" for i in intfs)
        subprocess.run(["ip", "-force", "-batch", "-"], input=batch, text=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    if del_br is not None:
        del_br.wait()
    cpuclass.remove_groups(record.cgroups)
    for p in record.paths:
        shutil.rmtree(p, ignore_errors=True)
    record.path.unlink(missing_ok=True)
    return {"processes": killed, "bridges": len(bridges), "interfaces": len(intfs)}


def stale_records() -> tuple[list[RunRecord], list[RunRecord]]:
    """(records of dead runs, records of runs still alive)."""
    dead, alive = [], []
    if not records_dir().is_dir():
        return dead, alive
    for path in sorted(records_dir().glob("*.json")):
        try:
            rec = RunRecord.load(path)
        except (OSError, ValueError, TypeError):
            continue
        (alive if rec.owner_alive() else dead).append(rec)
    return dead, alive
