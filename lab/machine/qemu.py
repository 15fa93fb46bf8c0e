"""What this machine has for a VM: QEMU and the image tools, and whether KVM works here.

Kept apart from ``lab.machine.vm`` (the image and its boots): these answers are asked
before anything is created, and a test can stand in for the machine's CPU flags.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from lab.model.errors import MachineError


def require_tools(build: bool) -> None:
    """One line naming what is missing, before anything is created."""
    need = {"qemu-system-x86_64": "qemu-system-x86", "qemu-img": "qemu-utils"}
    if build:
        need.update({"mmdebstrap": "mmdebstrap", "mkfs.ext4": "e2fsprogs"})
    missing = sorted({pkg for tool, pkg in need.items() if not shutil.which(tool)})
    if missing:
        raise MachineError("vm", f"{', '.join(t for t in need if not shutil.which(t))} not "
                           f"found (apt-get install {' '.join(missing)})")


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    m = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    return set(m.group(1).split()) if m else set()


def accelerator(kernel: Path | None = None) -> str:
    """``kvm`` where it works, else ``tcg``.

    ``/dev/kvm`` alone proves nothing: without hardware virtualisation (no ``vmx``/``svm``,
    as in a VM without nesting) QEMU opens it and then hangs. Where the flags are there, a
    short probe boots the kernel with no root disk under KVM: it must panic and exit with
    ``-no-reboot`` within a few seconds. ``FABRICLAB_VM_ACCEL`` forces a choice.
    """
    forced = os.environ.get("FABRICLAB_VM_ACCEL")
    if forced in ("kvm", "tcg"):
        return forced
    if not os.access("/dev/kvm", os.R_OK | os.W_OK) or not cpu_flags() & {"vmx", "svm"}:
        return "tcg"
    if kernel is None:
        return "tcg"
    cmd = ["qemu-system-x86_64", "-accel", "kvm", "-m", "256", "-kernel", str(kernel),
           "-append", "console=ttyS0 panic=-1", "-no-reboot", "-display", "none",
           "-serial", "none", "-nic", "none"]
    try:
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=20,
                       check=False)
    except subprocess.TimeoutExpired:
        return "tcg"
    return "kvm"


def qemu_version() -> str:
    out = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True,
                         check=False)
    m = re.search(r"version (\S+)", out.stdout)
    return m.group(1) if m else "unknown"
