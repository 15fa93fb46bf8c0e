"""The cluster lane: two VM-lane guests joined by a network only they see (``fabriclab vm
cluster up``), the first the head. Each test runs FabricLab on the head over ssh, as a
class or a user would, and reads its results there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from lab.machine import vmcluster

CLI = [sys.executable, "-m", "lab.cli"]
#: The cluster file `vm cluster up` writes on the head.
CLUSTER = vmcluster.GUEST_CLUSTER_FILE


class Lane:
    """A running VM cluster, driven from this machine."""

    def __init__(self, cluster: vmcluster.VmCluster) -> None:
        self.cluster = cluster

    def sh(self, line: str, worker: int = 1, check: bool = True,
           timeout_s: float = 1800) -> subprocess.CompletedProcess:
        """A shell line on a guest (1: the head); fails the test on a non-zero exit."""
        m = self.cluster.members[worker - 1]
        out = subprocess.run(m.ssh(self.cluster.key, self.cluster.known_hosts, line),
                             capture_output=True, text=True, timeout=timeout_s, check=False)
        if check and out.returncode != 0:
            pytest.fail(f"w{worker}: `{line}` exited {out.returncode}:\n"
                        f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        return out

    def run(self, out: str, scenario: str, *args: str, cluster: bool = True) -> dict[str, Any]:
        """`fabriclab run` on the head (split over the cluster, or on the head alone)."""
        split = f"--cluster {CLUSTER}" if cluster else ""
        self.sh(f"fabriclab run {scenario} {split} --out {out} {' '.join(args)}")
        return json.loads(self.sh(f"cat {out}/result.json").stdout)

    def leftovers(self, worker: int) -> dict[str, Any]:
        """What a run could leave on a guest: bridges, the lab's interfaces and tunnels,
        run records, and processes carrying a run's marker."""
        line = ("ovs-vsctl list-br | tr '\\n' ' '; echo '|'; "
                "ip -o link | awk '{print $2}' | grep -e '-eth' | tr '\\n' ' '; echo '|'; "
                "ls /run/fabriclab/runs 2>/dev/null | tr '\\n' ' '; echo '|'; "
                "grep -l -a FABRICLAB_RUN= /proc/[0-9]*/environ 2>/dev/null | "
                "grep -v -e /self/ -e \"/$$/\" | tr '\\n' ' '")
        fields = self.sh(line, worker).stdout.split("|")
        return {k: v.split() for k, v in zip(("bridges", "interfaces", "records", "processes"),
                                             fields, strict=True)}


@pytest.fixture(scope="session")
def lane() -> Iterator[Lane]:
    """Boot the two guests for the session (or use the cluster already up, with
    FABRICLAB_CLUSTER_REUSE=1), and stop them at the end."""
    reuse = os.environ.get("FABRICLAB_CLUSTER_REUSE") == "1"
    started = False
    try:
        cluster = vmcluster.VmCluster.load() if reuse else None
    except Exception:
        cluster = None
    if cluster is None:
        up = subprocess.run([*CLI, "vm", "cluster", "up", "--workers", "2"],
                            capture_output=True, text=True, check=False)
        assert up.returncode == 0, up.stdout + up.stderr
        started = True
        cluster = vmcluster.VmCluster.load()
    try:
        yield Lane(cluster)
    finally:
        if started:
            subprocess.run([*CLI, "vm", "cluster", "down"], check=False)
