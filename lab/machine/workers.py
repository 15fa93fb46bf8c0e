"""A cluster's workers brought to the head's code, checked, and cleaned: over ssh, by record.

``fabriclab cluster setup FILE`` copies the head's checkout (what ``git ls-files`` lists,
tracked and untracked, as the VM lane copies it) to the same path on every other worker
and runs the one set-up entry point there, ``lab/provision.sh``; it is idempotent. Then it
compares every worker's facts with the head's: the lab's code, Open vSwitch, Mininet,
Python. ``fabriclab clean --cluster FILE`` runs ``fabriclab clean`` on every worker, which
applies that worker's records of dead runs; nothing is removed by name.
"""

from __future__ import annotations

import json
import platform
import shlex
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab.machine import environment, remote, state, vm
from lab.model.cluster import ClusterError, ClusterSpec, WorkerSpec

Progress = Callable[[str], None]
#: The facts two workers of one cluster must share.
FACTS = ("lab", "ovs", "mininet", "python")


def _tool_version(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError:
        return "absent"
    out = done.stdout + done.stderr            # `mn --version` prints to stderr
    return (out.strip().splitlines() or ["absent"])[0]


def facts() -> dict[str, Any]:
    """This machine's side of the comparison, and whether a lab runs here now."""
    busy = state.lock_held()
    return {"lab": environment.lab_version(), "repo": str(environment.REPO_ROOT),
            "ovs": _tool_version(["ovs-vsctl", "--version"]),
            "mininet": _tool_version(["mn", "--version"]),
            "python": platform.python_version(), "busy": busy}


def remote_facts(worker: WorkerSpec) -> dict[str, Any]:
    """A worker's :func:`facts`; a worker without the lab is refused, naming the fix."""
    if worker.local:
        return facts()
    remote.reachable(worker)
    out = remote.run(worker, "fabriclab cluster facts", timeout_s=120)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ClusterError(f"workers[{worker.name}]", "has no FabricLab (`fabriclab cluster "
                           "facts` failed); run `fabriclab cluster setup FILE` on the head") \
            from None


def check(spec: ClusterSpec, progress: Progress = print) -> dict[str, dict[str, Any]]:
    """Every worker reachable, with the head's lab and tools, and not running a lab; else
    one line naming the first worker that is not."""
    head = facts()
    seen = {}
    for w in spec.workers:
        got = head if w.name == spec.head else remote_facts(w)
        for key in FACTS:
            if got.get(key) != head[key]:
                raise ClusterError(f"workers[{w.name}]", f"{key} is {got.get(key)!r}, the "
                                   f"head's {head[key]!r}: run `fabriclab cluster setup "
                                   f"{spec.path}` on the head")
        if got.get("busy") and w.name != spec.head:
            raise ClusterError(f"workers[{w.name}]", "is already running a lab; wait for "
                               "it or stop it")
        seen[w.name] = got
        progress(f"[cluster] {w.name}: lab {got['lab']}, {got['ovs']}")
    return seen


def setup(spec: ClusterSpec, progress: Progress = print) -> None:
    """Bring every other worker to the head's checkout and set it up; then :func:`check`."""
    repo = environment.REPO_ROOT
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "checkout.tar"
        vm.checkout_tar(tar)
        for w in spec.workers:
            if w.local:
                continue
            remote.reachable(w)
            progress(f"[cluster] {w.name}: copying the checkout to {repo}")
            dest = shlex.quote(str(repo))
            # The lab's own files are replaced (a file gone from the head goes there too);
            # its environments (.venv*, *.egg-info) stay for set-up to find.
            line = (f"mkdir -p {dest} && cd {dest} && {{ [ ! -e setup.py ] || [ -d lab ]; }} "
                    "&& find . -mindepth 1 -maxdepth 1 ! -name '.venv*' ! -name '*.egg-info' "
                    "-exec rm -rf {} + && tar -x")
            with tar.open("rb") as stdin:
                out = subprocess.run(remote.ssh(w.ssh, line), stdin=stdin,
                                     capture_output=True, check=False, timeout=600)
            if out.returncode != 0:
                raise ClusterError(f"workers[{w.name}]", "copying the checkout failed: "
                                   f"{out.stderr.decode(errors='replace').strip()[-200:]}")
            progress(f"[cluster] {w.name}: lab/provision.sh")
            out = remote.run(w, f"bash {dest}/lab/provision.sh {dest}", timeout_s=3600)
            if out.returncode != 0:
                raise ClusterError(f"workers[{w.name}]", "lab/provision.sh failed: "
                                   f"{(out.stdout + out.stderr).strip()[-300:]}")
    check(spec, progress)


def clean(spec: ClusterSpec, progress: Progress = print) -> int:
    """``fabriclab clean`` on every remote worker (the head cleans itself); how many failed."""
    failed = 0
    for w in spec.workers:
        if w.local:
            continue
        out = remote.run(w, "fabriclab clean", timeout_s=300)
        for line in (out.stdout + out.stderr).strip().splitlines():
            progress(f"[cluster] {w.name}: {line}")
        failed += out.returncode != 0
    return failed
