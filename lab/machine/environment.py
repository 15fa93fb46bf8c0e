"""What this kernel and machine offer, and which mechanism the lab picks for each job.

The CI machine has no kernel modules (userspace OVS, no netem/RED/DCTCP); the Vagrant VM has a
full kernel. Rather than assume either, the lab probes once per run and records the choice
in every result, so a number is never read without knowing what produced it.

Qdisc probes run in a throwaway network namespace (``unshare -n``) so they touch nothing of
the machine's.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from controllers import runtime_select
from lab import REPO_ROOT
from lab.machine import ovs_service

#: The controller runtimes, as the controller names them.
RUNTIMES = tuple(runtime_select.RUNTIMES)


def qdisc_available(kind_args: str) -> bool:
    """Can this kernel attach qdisc ``kind_args`` (e.g. ``netem delay 1ms``)?"""
    if not shutil.which("unshare") or not shutil.which("tc"):
        return False
    probe = f"tc qdisc add dev lo root {kind_args}"
    return ovs_service.run_ok(["unshare", "-n", "sh", "-c", probe])


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def ryu_python() -> str:
    """The interpreter that has Ryu 4.34 (its own venv: its pins conflict with os-ken's)."""
    if os.environ.get("FABRICLAB_RYU_PYTHON"):
        return os.environ["FABRICLAB_RYU_PYTHON"]
    pointer = Path(sys.prefix) / "fabriclab-ryu-python"   # written by lab/setup.sh
    if pointer.is_file():
        return pointer.read_text().strip()
    return str(REPO_ROOT / ".venv-ryu" / "bin" / "python")


def runtime_python(runtime: str) -> str:
    return sys.executable if runtime == "os-ken" else ryu_python()


def runtime_version(runtime: str) -> str | None:
    """Version of an installed controller runtime, or None when it is not installed."""
    if runtime == "os-ken":
        if importlib.util.find_spec("os_ken") is None:
            return None
        return importlib.metadata.version("os-ken")
    py = ryu_python()
    if not os.access(py, os.X_OK):
        return None
    try:
        probe = "import importlib.metadata as m, ryu; print(m.version('ryu'))"
        out = subprocess.run([py, "-c", probe], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


#: What a machine without PyTorch is told, for the collective library only.
TORCH_MISSING = "not installed (run: make setup)"
#: Run in a child: torch costs a second and a few hundred MB to import, which the lab's own
#: process never needs. The NumPy bridge is checked because a pip NumPy 2 breaks Debian's
#: torch 1.13 there (tensors still work, ``.numpy()`` does not).
_TORCH_PROBE = """
import json
out = {"torch": None, "gloo": False, "numpy": None, "numpy_bridge": False}
try:
    import torch, torch.distributed as dist
    out["torch"] = torch.__version__
    out["gloo"] = bool(dist.is_available() and dist.is_gloo_available())
    import numpy
    out["numpy"] = numpy.__version__
    out["numpy_bridge"] = torch.zeros(3).numpy().tolist() == [0.0, 0.0, 0.0]
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
print(json.dumps(out))
"""


def collective_library() -> dict[str, object]:
    """PyTorch as the lab's interpreter sees it: version, gloo backend, NumPy bridge.

    ``torch`` is None where it is not installed: only the gloo scenarios need it.
    """
    if importlib.util.find_spec("torch") is None:
        return {"torch": None, "gloo": False, "numpy": None, "numpy_bridge": False}
    try:
        out = subprocess.run([sys.executable, "-c", _TORCH_PROBE], capture_output=True,
                             text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return {"torch": None, "gloo": False, "numpy": None, "numpy_bridge": False,
                "error": "the torch probe did not answer"}


@dataclass
class Environment:
    """The machine facts a result depends on, and the mechanisms chosen from them."""

    kernel: str
    datapath: str                      # "kernel" | "user"
    userspace_tso: bool
    netem: bool
    red: bool
    ecn: str                           # "red" | "tc-bpf" | "none"
    delay: str                         # "netem" | "none"
    congestion_controls: list[str]
    dctcp: bool
    runtimes: dict[str, str | None] = field(default_factory=dict)
    controller: str = ""               # runtime picked for this run, e.g. "os-ken 4.2.2"
    notes: list[str] = field(default_factory=list)
    #: Set inside ``fabriclab vm``'s guest: accelerator (kvm/tcg), vCPUs, memory, image.
    vm: dict[str, object] | None = None

    def as_result(self) -> dict[str, object]:
        """The ``environment`` block of result.json."""
        return {"datapath": self.datapath, "ecn": self.ecn, "delay": self.delay,
                "controller": self.controller, "kernel": self.kernel,
                "userspace_tso": self.userspace_tso,
                "congestion_controls": self.congestion_controls, "vm": self.vm}

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def pick_runtime(runtimes: dict[str, str | None], wanted: str | None) -> str:
    """The runtime to use: the one asked for, else os-ken (maintained), else Ryu."""
    from lab.model.errors import MachineError
    if wanted:
        if wanted not in RUNTIMES:
            raise MachineError("controller", f"unknown controller runtime {wanted!r} "
                               f"(known: {', '.join(RUNTIMES)})")
        if not runtimes.get(wanted):
            raise MachineError("controller", f"{wanted} is not installed (run: make setup)")
        return wanted
    for name in RUNTIMES:
        if runtimes.get(name):
            return name
    raise MachineError("controller", "neither os-ken nor Ryu is installed (run: make setup)")


#: Set by ``fabriclab vm``'s guest job (lab/vm_guest.sh) to the VM's facts, as JSON.
VM_ENV = "FABRICLAB_VM"
#: The same facts, where a guest that stays up (a VM cluster's) keeps them for its logins.
VM_FILE = Path("/etc/fabriclab/vm.json")


#: The rate profile of a VM without hardware virtualisation: every rate and size x 1/8
#: (``scenario.scale_rates``). Measured in the TCG guest on 2 vCPUs against the 25 % idle
#: line (docs/full-kernel.md): at full rates ecmp-basic left 0-1 % idle; at a quarter
#: ecmp-basic 14-26 %, incast-ecn 12-24 %, streaming's incident 15 %, under the line in at
#: least one run each; at an eighth all three stay well above it. A scenario that needs
#: less carries its own ``tcg_rate_scale``.
TCG_RATE_SCALE = 0.125


def vm_rate_scale(tcg: float | None = None) -> float:
    """The rate profile for this machine: in a TCG guest the scenario's own ``tcg`` profile
    where it has one, else TCG_RATE_SCALE; 1 anywhere else."""
    vm = guest_vm()
    if vm is None or vm.get("accelerator") != "tcg":
        return 1.0
    return TCG_RATE_SCALE if tcg is None else tcg


def guest_vm() -> dict[str, object] | None:
    """The VM this run is in, as ``fabriclab vm`` booted it; None on any other machine.

    Only the host knows how the guest was booted (KVM or TCG, vCPUs), so it hands the facts
    in; the guest adds its own kernel. A result from a VM must say so: under TCG every
    process costs ~10x, which is what its fidelity numbers then describe.
    """
    raw = os.environ.get(VM_ENV)
    if not raw:                       # a cluster guest's ssh sessions: the boot's own file
        try:
            raw = VM_FILE.read_text()
        except OSError:
            return None
    try:
        facts = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(facts, dict):
        return None
    facts["guest_kernel"] = platform.release()
    return facts


def detect(runtime: str | None = None, probe_runtimes: bool = True) -> Environment:
    """Probe the kernel and tools. ``runtime`` picks the controller runtime to record."""
    netem = qdisc_available("netem delay 1ms")
    red = qdisc_available("red limit 400000 min 30000 max 90000 avpkt 1500 burst 55 "
                          "probability 0.1 bandwidth 100mbit ecn")
    cc = _read("/proc/sys/net/ipv4/tcp_available_congestion_control").split()
    # Marking must see the queue: RED where the kernel has it, else a tc-BPF virtual queue
    # (needs clang to build it and bpftool to program it). nftables can set CE but cannot
    # see a queue, so it is not a marker.
    if red:
        ecn = "red"
    elif shutil.which("clang") and shutil.which("bpftool"):
        ecn = "tc-bpf"
    else:
        ecn = "none"
    dp = ovs_service.datapath()
    tso = False
    notes: list[str] = []
    if ovs_service.db_running():
        out = subprocess.run(["ovs-vsctl", "--timeout=2", "get", "Open_vSwitch", ".",
                              "other_config:userspace-tso-enable"],
                             capture_output=True, text=True)
        tso = out.stdout.strip().strip('"') == "true"
        if dp == "user" and not tso:
            notes.append("userspace datapath without userspace-tso-enable: TCP will stall "
                         "(restart ovs-vswitchd after `make setup`)")
        sndbuf = ovs_service.vswitchd_send_buffer() if dp == "user" else None
        if sndbuf is not None and sndbuf < ovs_service.SEND_BUFFER_BYTES:
            notes.append(f"ovs-vswitchd's send socket has a {sndbuf // 1024} KiB buffer: "
                         "ports may drop packets without counting them (stop ovs-vswitchd "
                         "and run `make setup`)")
    else:
        notes.append("Open vSwitch is not running (run: make setup)")
    runtimes = {name: runtime_version(name) for name in RUNTIMES} if probe_runtimes else {}
    env = Environment(kernel=platform.release(), datapath=dp, userspace_tso=tso, netem=netem,
                      red=red, ecn=ecn, delay="netem" if netem else "none",
                      congestion_controls=cc, dctcp="dctcp" in cc, runtimes=runtimes,
                      notes=notes, vm=guest_vm())
    if probe_runtimes:
        chosen = pick_runtime(runtimes, runtime)
        env.controller = f"{chosen} {runtimes[chosen]}"
    return env


#: What decides the lab's behaviour on a machine: its code and its scenarios.
_VERSION_PARTS = ("lab", "controllers", "scenarios", "setup.py")
_VERSION_SUFFIXES = (".py", ".sh", ".c", ".yaml", ".yml", ".txt")


def lab_version() -> str:
    """A hash of the lab's code as checked out here.

    Not a git commit: a worker's checkout is a copy (``fabriclab cluster setup``, or the VM
    lane's tarball) without ``.git``. Two machines with the same hash run the same lab.
    """
    h = hashlib.sha256()
    files: list[Path] = []
    for part in _VERSION_PARTS:
        p = REPO_ROOT / part
        files += [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()
                                           and f.suffix in _VERSION_SUFFIXES
                                           and "__pycache__" not in f.parts]
    for f in sorted(files):
        h.update(str(f.relative_to(REPO_ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]
