"""One rank of a data-parallel job on PyTorch's gloo: ``python -m lab.agents.worker gloo``.

The synthetic ring (:mod:`lab.agents.ring`) is the lab's model of a collective; this is the
real library beside it. Every step the rank computes (sleeps, as the ring does), then calls
``torch.distributed.all_reduce`` on a float32 tensor of S bytes, then ``barrier``: gloo
moves the bytes over its own TCP connections, chosen and numbered by gloo, not by the lab.

So the lab cannot fix these connections' 5-tuples in advance as it does the ring's. After
rendezvous (``init_method=tcp://<rank 0's fabric address>``, ``GLOO_SOCKET_IFNAME`` = this
host's fabric interface) the rank finds gloo's connections itself: the TCP sockets this
process holds, read from its own namespace's ``/proc/self/net/tcp``, less the rendezvous
store's. It writes them to ``--conns-out`` and then waits for the lab's go
(:mod:`lab.agents.golatch`): by then the lab has put a counter on every switch for each of
them (and pinned them, in a placed phase), so their paths come from the switches' counters
exactly as the ring's do.

Epochs (``--epoch-steps``): the ring opens new connections every E steps (a new ECMP hash
roll); here each epoch is a process group of its own (``new_group`` of every rank), whose
gloo context connects its own full mesh. All groups are made before the go, so every
connection is known, and watched, before the first measured byte.

A connection's own counters (``TCP_INFO``: bytes acked, retransmits, ...) are reported from
the go on (``FROM_GO``), and its ``t_open`` is the go: gloo opened it at rendezvous, whose
exchanges (and, for DDP, the parameter broadcast and first iteration) are set-up, not the
job. The lab opens its measurement window just before the go, so these counters and the
switches' count the same traffic.

Threads are bounded (one intra-op and one inter-op thread, ``OMP_NUM_THREADS=1``) so that N
ranks on two cores leave the emulated network its CPU. The JSON is the ring's (its
``steps`` and ``connections`` entries are the same), plus ``library``, ``torch``,
``algorithm`` and ``groups`` (every connection of every epoch, with its peer's rank).

This runs inside hosts: the standard library and torch, nothing of the lab.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import time
from datetime import timedelta
from typing import Any

from lab.agents import golatch
from lab.agents.common import TOTAL_RETRANS_OFFSET, tcp_info, tcp_u32, write_json
from lab.agents.workerbase import CollectiveError, cpu_s, now, stamp

#: gloo's All-Reduce for dense CPU tensors with default options: ``gloo::allreduce`` with
#: an unspecified algorithm, which gloo runs as its ring (reduce-scatter then all-gather in
#: at least 2N pipelined segments, rank r sending to rank r-1). The lab checks this
#: against the bytes each connection carried (``lab.kinds.collective.gloo.algorithm_seen``).
ALGORITHM = "ring"
#: Bytes per element of the all-reduced tensor (float32, what gradients usually are).
ELEMENT_BYTES = 4
#: TCP_INFO counters a connection reports from the go on, not over its life: rendezvous
#: (and whatever a program does before the go) is set-up, not the measured job.
FROM_GO = ("retransmits", "bytes_acked", "bytes_sent", "bytes_retrans", "segs_out")
_TCP_ESTABLISHED = "01"


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def own_tcp_sockets() -> dict[int, tuple[int, tuple[str, int], tuple[str, int]]]:
    """{inode: (fd, local, remote)} of this process's established IPv4 TCP sockets.

    ``/proc/self/net/tcp`` is this namespace's table (every socket of the host); the
    process's own descriptors say which of them are ours. The addresses are the
    descriptor's own: under ``mptcpize`` every subflow of a connection is in the table
    under its socket's inode, and the socket's names are the connection's (its first
    subflow's), the 5-tuple its joined subflows are found from.
    """
    fds: dict[int, int] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:["):
            fds[int(link[8:-1])] = int(name)
    with open("/proc/self/net/tcp") as table:
        next(table)
        established = {int(cols[9]) for cols in map(str.split, table)
                       if cols[3] == _TCP_ESTABLISHED}
    out = {}
    for inode in sorted(established & set(fds)):
        with socket.socket(fileno=os.dup(fds[inode])) as sock:
            try:
                out[inode] = (fds[inode], sock.getsockname()[:2], sock.getpeername()[:2])
            except OSError:         # closed since the table was read
                continue
    return out


class GlooRank:
    """One training rank on gloo: compute, ``all_reduce``, ``barrier``; ``--steps`` times."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.steps: list[dict[str, Any]] = []
        self.groups: list[dict[str, Any]] = []       # per epoch: its connections
        self.socks: list[list[socket.socket]] = []   # per epoch: dups of gloo's sockets
        self.to_next: list[socket.socket | None] = []
        self.connections: list[dict[str, Any]] = []
        self.known: set[int] = set()
        self.rng = random.Random(args.seed + args.rank)
        self.t_ready: float | None = None
        self.t_go: float | None = None
        self.at_go: list[dict[str, Any]] = []       # each connection's TCP_INFO at the go
        self.torch_version: str | None = None
        self.dist: Any = None

    # -- rendezvous and gloo's connections -----------------------------------------------------

    def _import_torch(self) -> Any:
        """torch with its threads bounded; gloo told which interface is the fabric."""
        os.environ["GLOO_SOCKET_IFNAME"] = self.args.iface
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = "1"
        try:
            import torch
            import torch.distributed as dist
        except ImportError as exc:
            raise CollectiveError(f"torch is not installed (run: make setup): {exc}") from None
        if not dist.is_available() or not dist.is_gloo_available():
            raise CollectiveError("this torch has no gloo backend (run: make setup)")
        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
        self.torch_version = torch.__version__
        self.dist = dist
        return torch

    def _new_connections(self, epoch: int) -> None:
        """Record the sockets gloo opened since the last look (one epoch's full mesh)."""
        a = self.args
        store_port = a.master[1]
        found = own_tcp_sockets()
        conns, socks, nxt = [], [], None
        rank_of = {ip: r for r, ip in enumerate(a.peers)}
        for inode, (fd, local, remote) in sorted(found.items()):
            if inode in self.known:
                continue
            self.known.add(inode)
            if store_port in (local[1], remote[1]):
                continue                     # the rendezvous store's, not gloo's
            peer = rank_of.get(remote[0])
            conns.append({"epoch": epoch, "src": local[0], "sport": local[1],
                          "dst": remote[0], "dport": remote[1], "peer_rank": peer})
            sock = socket.socket(fileno=os.dup(fd))
            socks.append(sock)
            if peer == (a.rank - 1) % a.world:     # gloo's ring sends to rank - 1
                nxt = sock
        self.groups.append({"epoch": epoch, "connections": conns})
        self.socks.append(socks)
        self.to_next.append(nxt)

    def _rendezvous(self) -> list[Any]:
        """The default group and one more per extra epoch; their connections recorded."""
        a, dist = self.args, self.dist
        self.known = set(own_tcp_sockets())
        timeout = timedelta(seconds=max(a.connect_timeout_s, a.io_timeout_s))
        dist.init_process_group("gloo", init_method=f"tcp://{a.master[0]}:{a.master[1]}",
                                rank=a.rank, world_size=a.world, timeout=timeout)
        groups = [dist.group.WORLD]
        self._new_connections(0)
        for e in range(1, a.epochs):
            groups.append(dist.new_group(list(range(a.world)), timeout=timeout))
            self._new_connections(e)
        return groups

    # -- steps ---------------------------------------------------------------------------------

    def _compute_time(self) -> float:
        a = self.args
        t = max(0.0, a.compute_s + self.rng.uniform(-a.jitter_s, a.jitter_s))
        return t + (a.straggler_s if a.rank == a.straggler_rank else 0.0)

    def _retrans(self, epoch: int) -> int:
        sock = self.to_next[epoch]
        return tcp_u32(sock, TOTAL_RETRANS_OFFSET) if sock is not None else 0

    def _step(self, step: int, epoch: int, group: Any, grad: Any) -> dict[str, Any]:
        """One step: compute, all-reduce (checked: every rank's r+1 summed), barrier."""
        a, dist = self.args, self.dist
        warmup = step < a.warmup
        if a.sizes:
            warmup = step % a.steps < a.warmup
        grad.fill_(a.rank + 1)                 # before the step: not part of its time
        retrans0 = self._retrans(epoch)
        t_start = now()
        _sleep_until(t_start + self._compute_time())
        t_compute_end = now()
        dist.all_reduce(grad, group=group)
        t_comm_end = now()
        dist.barrier(group=group)
        t_end = now()
        want = a.world * (a.world + 1) / 2
        if float(grad[0]) != want or float(grad[-1]) != want:
            raise CollectiveError(f"step {step}: all_reduce gave {float(grad[0])}, "
                                  f"expected {want}")
        compute_s, step_s = t_compute_end - t_start, t_end - t_start
        return {
            "step": step, "epoch": epoch, "warmup": warmup,
            "size_bytes": int(grad.numel()) * ELEMENT_BYTES,
            "t_start": stamp(t_start), "t_compute_end": stamp(t_compute_end),
            "t_comm_start": stamp(t_compute_end), "t_comm_end": stamp(t_comm_end),
            "t_end": stamp(t_end), "compute_s": stamp(compute_s),
            "comm_s": stamp(t_comm_end - t_compute_end),
            "barrier_s": stamp(t_end - t_comm_end), "step_s": stamp(step_s),
            "idle_s": stamp(step_s - compute_s), "retrans": self._retrans(epoch) - retrans0,
        }

    def run(self) -> None:
        """Rendezvous, say which connections gloo opened, wait for the go, run every step."""
        a = self.args
        golatch.hold()
        torch = self._import_torch()
        groups = self._rendezvous()
        write_json({"rank": a.rank, "groups": self.groups}, a.conns_out)
        self.wait_for_go()
        # One tensor per size (a sweep: --steps steps of each, in order), made before the go.
        grads = [torch.zeros(size // ELEMENT_BYTES, dtype=torch.float32)
                 for size in a.sizes or [a.size]]
        self.dist.barrier(group=groups[0])     # every rank starts step 0 together
        self.t_ready = now()
        epoch = 0
        for step in range(a.steps * len(grads)):
            e = step // a.epoch_steps if a.epoch_steps else 0
            if e != epoch:
                epoch = e
                self.dist.barrier(group=groups[e])   # lined up again, outside step time
            self.steps.append(self._step(step, e, groups[e], grads[step // a.steps]))

    def wait_for_go(self) -> None:
        """Ready, then the lab's go; every connection's counters read at the go, from
        which they are reported (``FROM_GO``)."""
        a = self.args
        if not golatch.ready_then_wait(a.ready_file, a.connect_timeout_s):
            raise CollectiveError(f"no go from the lab within {a.connect_timeout_s:g} s")
        self.t_go = now()
        self.at_go = [_info(s) for socks in self.socks for s in socks]

    def close(self) -> None:
        """Each connection's TCP_INFO from the go on (both ends report theirs), then leave
        the group."""
        t = stamp(now())
        socks_all = [s for socks in self.socks for s in socks]
        base = self.at_go if len(self.at_go) == len(socks_all) else [{}] * len(socks_all)
        i = 0
        for group, socks in zip(self.groups, self.socks, strict=False):
            for rec, sock in zip(group["connections"], socks, strict=True):
                info = _info(sock)
                for k in FROM_GO:
                    if k in info and k in base[i]:
                        info[k] -= base[i][k]
                t_open = {} if self.t_go is None else {"t_open": stamp(self.t_go)}
                self.connections.append({**rec, **info, **t_open, "t_close": t})
                sock.close()
                i += 1
        self.socks = []
        if self.dist is not None and self.dist.is_initialized():
            self.dist.destroy_process_group()

    def summary(self, error: str | None) -> dict[str, Any]:
        a = self.args
        return {
            "mode": "ring", "library": "gloo", "torch": self.torch_version,
            "algorithm": ALGORITHM, "rank": a.rank, "world": a.world, "size_bytes": a.size,
            "sizes": a.sizes or [],
            "buckets": 1, "clock": "monotonic", "master": f"{a.master[0]}:{a.master[1]}",
            "iface": a.iface, "steps_requested": a.steps, "compute_s": a.compute_s,
            "jitter_s": a.jitter_s, "seed": a.seed, "straggler_rank": a.straggler_rank,
            "straggler_s": a.straggler_s, "epoch_steps": a.epoch_steps, "warmup": a.warmup,
            "t_ready": None if self.t_ready is None else stamp(self.t_ready),
            "steps": self.steps, "groups": self.groups, "connections": self.connections,
            "cpu_s": cpu_s(), "error": error,
        }


def _info(sock: socket.socket) -> dict[str, Any]:
    """A connection's TCP_INFO, or nothing once the socket is gone."""
    try:
        return tcp_info(sock)
    except OSError:
        return {}
