"""The cluster file: which machines ("workers") one fabric is split over, and how to reach them.

A YAML mapping, checked like a scenario (one error naming the field, nothing started)::

    head: w1                      # where the controller, the measurements and results live
    tunnel: gre                   # cut links become gretap tunnels (the only kind)
    workers:
      - name: w1
        ssh: local                # the head itself: no ssh
        address: 192.168.77.1     # on the network between the workers (tunnel endpoints)
      - name: w2
        ssh: root@192.168.77.2    # an ssh destination: key login, no password
        address: 192.168.77.2
        cores: 2                  # optional: for the capacity model's estimate per worker
        nic_mbps: 1000            # optional: the worker's NIC towards the others
        mtu: 9000                 # optional: that NIC's MTU (default 1500)

The order of ``workers`` is the order locks are taken in and the order the partition plan
numbers its workers in (``lab.analysis.partition``), so one file gives one placement.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lab.model.errors import LabError
from lab.model.scenario import yaml_problem

#: Bytes a gretap tunnel with a key adds to an emulated frame (1514 bytes on the lab's links):
#: the outer IPv4 header (20), GRE with a key (8) and the inner Ethernet header (14). The
#: NIC between two workers must carry a 1500-byte emulated packet plus these.
GRE_OVERHEAD_BYTES = 42
#: The MTU of every emulated link (the lab's wire constants assume 1500-byte packets).
LINK_MTU = 1500
TUNNELS = ("gre",)
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,15}$")
_SSH = re.compile(r"^([A-Za-z0-9._-]+@)?[A-Za-z0-9._:-]+$")
_WORKER_KEYS = {"name", "ssh", "address", "cores", "nic_mbps", "mtu"}


class ClusterError(LabError):
    """A cluster file that cannot describe a cluster, or a worker that cannot serve in one."""


@dataclass(frozen=True)
class WorkerSpec:
    """One machine of a cluster, as the file names it."""

    name: str
    ssh: str
    address: str
    cores: int | None = None
    nic_mbps: float | None = None
    mtu: int = LINK_MTU

    @property
    def local(self) -> bool:
        """The head's own machine: reached without ssh."""
        return self.ssh == "local"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ssh": self.ssh, "address": self.address,
                "cores": self.cores, "nic_mbps": self.nic_mbps, "mtu": self.mtu}


@dataclass(frozen=True)
class ClusterSpec:
    """A checked cluster file."""

    path: Path
    head: str
    workers: tuple[WorkerSpec, ...]
    tunnel: str = "gre"

    def worker(self, name: str) -> WorkerSpec:
        return next(w for w in self.workers if w.name == name)

    @property
    def head_worker(self) -> WorkerSpec:
        return self.worker(self.head)


def _field(data: dict[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise ClusterError(f"{where}{key}", "missing")
    return data[key]


def _worker(data: Any, i: int) -> WorkerSpec:
    where = f"workers[{i}]."
    if not isinstance(data, dict):
        raise ClusterError(f"workers[{i}]", "expected a mapping with name, ssh and address")
    unknown = sorted(set(map(str, data)) - _WORKER_KEYS)
    if unknown:
        named = data.get("name")
        if isinstance(named, str) and _NAME.match(named):
            where = f"workers[{named}]."
        raise ClusterError(f"{where}{unknown[0]}",
                           f"unknown key (known: {', '.join(sorted(_WORKER_KEYS))})")
    name = _field(data, "name", where)
    if not isinstance(name, str) or not _NAME.match(name):
        raise ClusterError(f"{where}name", f"{name!r}: expected a short lower-case name "
                           "(a letter, then letters, digits or '-', at most 16)")
    where = f"workers[{name}]."
    ssh = _field(data, "ssh", where)
    if not isinstance(ssh, str) or not (ssh == "local" or _SSH.match(ssh)):
        raise ClusterError(f"{where}ssh", f"{ssh!r}: expected 'local' (the head itself) or "
                           "an ssh destination such as root@192.168.77.2")
    address = _field(data, "address", where)
    try:
        ip = ipaddress.IPv4Address(str(address))
    except ValueError:
        raise ClusterError(f"{where}address", f"{address!r}: expected an IPv4 address on "
                           "the network between the workers") from None
    if ip.is_loopback or ip.is_unspecified or ip.is_multicast:
        raise ClusterError(f"{where}address", f"{ip}: a tunnel endpoint must be an address "
                           "the other workers reach (not loopback, 0.0.0.0 or multicast)")
    cores = data.get("cores")
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int)
                              or cores < 1):
        raise ClusterError(f"{where}cores", f"{cores!r}: expected a whole number >= 1")
    nic = data.get("nic_mbps")
    if nic is not None and (isinstance(nic, bool) or not isinstance(nic, int | float)
                            or not nic > 0):
        raise ClusterError(f"{where}nic_mbps", f"{nic!r}: expected a rate in Mbit/s > 0")
    mtu = data.get("mtu", LINK_MTU)
    if isinstance(mtu, bool) or not isinstance(mtu, int) or not 576 <= mtu <= 65535:
        raise ClusterError(f"{where}mtu", f"{mtu!r}: expected an MTU in bytes (576-65535)")
    return WorkerSpec(name, ssh, str(ip), cores, None if nic is None else float(nic), mtu)


def parse(data: Any, path: Path) -> ClusterSpec:
    """Check a loaded cluster file; every problem names its field."""
    if not isinstance(data, dict):
        raise ClusterError("cluster", f"{path}: expected a mapping with head and workers")
    unknown = sorted(set(map(str, data)) - {"head", "workers", "tunnel"})
    if unknown:
        raise ClusterError(unknown[0], "unknown key (known: head, tunnel, workers)")
    raw = _field(data, "workers", "")
    if not isinstance(raw, list) or not raw:
        raise ClusterError("workers", "expected a list of at least one worker")
    workers = tuple(_worker(w, i) for i, w in enumerate(raw))
    for key in ("name", "address", "ssh"):
        seen: dict[str, str] = {}
        for w in workers:
            value = getattr(w, key)
            if key == "ssh" and value == "local":
                continue
            if value in seen:
                raise ClusterError(f"workers[{w.name}].{key}", f"{value} is also "
                                   f"{seen[value]}'s; every worker needs its own")
            seen[value] = w.name
    head = _field(data, "head", "")
    names = [w.name for w in workers]
    if head not in names:
        raise ClusterError("head", f"{head!r} is not one of the workers ({', '.join(names)})")
    locals_ = [w.name for w in workers if w.local]
    if locals_ and locals_ != [head]:
        raise ClusterError(f"workers[{locals_[-1]}].ssh", "only the head can be 'local'")
    tunnel = data.get("tunnel", "gre")
    if tunnel not in TUNNELS:
        raise ClusterError("tunnel", f"{tunnel!r}: known tunnels: {', '.join(TUNNELS)}")
    for w in workers:
        if w.mtu < LINK_MTU + GRE_OVERHEAD_BYTES and len(workers) > 1:
            raise ClusterError(f"workers[{w.name}].mtu",
                               f"{w.mtu} is below what a tunnel needs: a {LINK_MTU}-byte "
                               f"emulated packet plus {GRE_OVERHEAD_BYTES} bytes of gretap "
                               f"is {LINK_MTU + GRE_OVERHEAD_BYTES}; raise the NIC's MTU "
                               "(e.g. 9000) on the network between the workers")
    return ClusterSpec(path, str(head), workers, str(tunnel))


def load(path: str | Path) -> ClusterSpec:
    """Read and check a cluster file."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ClusterError("cluster", f"{p}: {yaml_problem(exc)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ClusterError("cluster", f"{p}: {getattr(exc, 'strerror', None) or exc}") \
            from None
    return parse(data, p)


def dump(spec: ClusterSpec) -> str:
    """The cluster file's text for ``spec`` (what ``fabriclab vm cluster up`` writes)."""
    return yaml.safe_dump({"head": spec.head, "tunnel": spec.tunnel,
                           "workers": [{k: v for k, v in w.as_dict().items() if v is not None}
                                       for w in spec.workers]}, sort_keys=False)
