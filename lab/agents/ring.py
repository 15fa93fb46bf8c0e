"""One rank of a ring All-Reduce training job: ``python -m lab.agents.worker ring``.

Every step the rank computes (sleeps), all-reduces its gradients with a ring All-Reduce over
real TCP, then joins a barrier - the pattern of NCCL's ring algorithm. A ring All-Reduce cannot
finish before its slowest hop has carried its share, so one congested or ECMP-collided link
stalls *every* GPU; that is what the lab reproduces and measures. The JSON this writes is
described in :mod:`lab.agents.worker`.

With ``--storage`` the rank has an input pipeline (:mod:`lab.agents.loader`) and a step first
waits for its batch, as a real one does: a step is then data wait + compute + the all-reduce's
exposed part (what runs past the compute's end) + barrier, and those four add up to the step.

With ``--live-file`` (the lab gives it only while a live view is on) the rank also rewrites a
small JSON file with its recent parts as spans, at most every half second
(:class:`lab.agents.workerbase.LiveParts`).

This runs inside hosts: standard library only, nothing of the lab.
"""

from __future__ import annotations

import argparse
import queue
import random
import select
import socket
import threading
import time
from typing import Any

from lab.agents.common import TOTAL_RETRANS_OFFSET, congestion_control, tcp_u32
from lab.agents.loader import Loader, wait_for_batch
from lab.agents.workerbase import (
    LOWAT_BYTES,
    CollectiveError,
    LiveParts,
    accept,
    connect,
    connection_record,
    cpu_s,
    finish_connection,
    fmt_addr,
    listen,
    now,
    stamp,
)


def _sleep_until(deadline: float) -> None:
    """Sleep to an absolute time, so overshoot in one compute part does not add up over parts."""
    delay = deadline - now()
    if delay > 0:
        time.sleep(delay)


class RingLink:
    """One rank's two ring connections: ``out`` to the next rank, ``inp`` from the previous one.

    Data only flows rank → next rank, so each connection carries one hop of the ring in one
    direction (ACKs come back) and the lab's counters for its 5-tuple measure exactly that hop.
    The All-Reduce and the barrier share the connections; the byte counts frame the stream.
    """

    def __init__(self, rank: int, world: int, io_timeout_s: float) -> None:
        self.rank, self.world, self.io_timeout_s = rank, world, io_timeout_s
        self.out: socket.socket | None = None
        self.inp: socket.socket | None = None
        self._token = memoryview(bytearray(world))
        self._lowat = 1
        # Peer addresses for error messages, kept because a dead socket no longer knows them.
        self._next_name = self._prev_name = "?"

    def attach(self, out: socket.socket, inp: socket.socket) -> None:
        """Use a new epoch's connections; non-blocking, because one poll loop drives both."""
        out.setblocking(False)
        inp.setblocking(False)
        self.out, self.inp, self._lowat = out, inp, 1
        self._next_name, self._prev_name = fmt_addr(out.getpeername()), fmt_addr(inp.getpeername())

    def allreduce(self, buf: memoryview) -> None:
        """Ring All-Reduce of ``buf`` in place: reduce-scatter then all-gather, 2(N−1) rounds.

        Nothing is added up: a GPU reduces a chunk at hundreds of GB/s, far faster than the
        network delivers it, so the reduction costs no time worth modelling, and skipping it
        keeps the CPU free for the emulated network. The data dependencies are kept exactly: in
        round r a rank sends chunk (rank − r) mod N - in reduce-scatter the partial sum it
        received in round r − 1, in all-gather the finished chunk it received in round r − 1 -
        and receives chunk (rank − r − 1) mod N. The same formula covers both phases.
        """
        self.exchange(buf, len(buf) // self.world, 2 * (self.world - 1))

    def barrier(self) -> None:
        """Dissemination barrier over the ring: N−1 lock-step rounds of a 1-byte token.

        A rank's k-th token leaves only after its (k−1)-th token arrived, so its (N−1)-th arriving
        proves every other rank has entered the barrier.
        """
        self.exchange(self._token, 1, self.world - 1)

    def exchange(self, buf: memoryview, chunk: int, rounds: int) -> None:
        """Run ``rounds`` lock-step ring rounds of ``chunk`` bytes over ``buf`` (N chunk slots).

        Sends and receives run concurrently (non-blocking sockets, one poll loop), but the chunk
        of round r leaves only once round r − 1's chunk has fully arrived, as in NCCL's ring: a
        rank never runs ahead of data it does not have, so one slow hop slows every rank.
        """
        assert self.out is not None and self.inp is not None
        total = rounds * chunk
        sent = got = 0
        out_fd, in_fd = self.out.fileno(), self.inp.fileno()
        poller = select.poll()
        masks = {out_fd: 0, in_fd: 0}
        deadline = now() + self.io_timeout_s
        while sent < total or got < total:
            allowed = min(total, (got // chunk + 1) * chunk)
            self._want(poller, masks, out_fd, select.POLLOUT if sent < allowed else 0)
            if got < total:
                self._set_lowat(min(LOWAT_BYTES, chunk - got % chunk))
            self._want(poller, masks, in_fd, select.POLLIN if got < total else 0)
            ready = poller.poll(max(0.0, deadline - now()) * 1000)
            if not ready:
                side = "data from the previous rank" if got < allowed else "the next rank to read"
                raise CollectiveError(f"waited {self.io_timeout_s:g} s for {side} "
                                      f"({got}/{total} bytes in, {sent}/{total} out)")
            moved = 0
            for fd, _events in ready:
                if fd == out_fd:
                    moved += (n := self._send(buf, sent, allowed, chunk))
                    sent += n
                else:
                    moved += (n := self._recv(buf, got, total, chunk))
                    got += n
            if moved:
                deadline = now() + self.io_timeout_s

    @staticmethod
    def _want(poller: select.poll, masks: dict[int, int], fd: int, mask: int) -> None:
        """Poll a socket only for what we need now (an idle socket must not wake us)."""
        if masks[fd] == mask:
            return
        if mask:
            poller.register(fd, mask)  # registers or modifies
        else:
            poller.unregister(fd)
        masks[fd] = mask

    def _set_lowat(self, nbytes: int) -> None:
        """Be woken at 64 kB or at the end of the round, whichever is first - not per packet."""
        if nbytes != self._lowat:
            assert self.inp is not None
            self.inp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, nbytes)
            self._lowat = nbytes

    def _send(self, buf: memoryview, sent: int, allowed: int, chunk: int) -> int:
        """Write as much of the rounds we may send as the socket takes now; return the bytes."""
        assert self.out is not None
        done = 0
        while sent + done < allowed:
            pos = sent + done
            base = (self.rank - pos // chunk) % self.world * chunk
            start, end = base + pos % chunk, base + chunk
            try:
                n = self.out.send(buf[start:end])
            except BlockingIOError:
                break
            except OSError as exc:
                raise CollectiveError(f"next rank {self._next_name}: "
                                      f"{exc.strerror}") from None
            done += n
            if n < end - start:
                break
        return done

    def _recv(self, buf: memoryview, got: int, total: int, chunk: int) -> int:
        """Read what has arrived, up to the end of the step's rounds; return the bytes."""
        assert self.inp is not None
        done = 0
        while got + done < total:
            pos = got + done
            base = (self.rank - pos // chunk - 1) % self.world * chunk
            start, end = base + pos % chunk, base + chunk
            try:
                n = self.inp.recv_into(buf[start:end])
            except BlockingIOError:
                break
            except OSError as exc:
                raise CollectiveError(f"previous rank {self._prev_name}: "
                                      f"{exc.strerror}") from None
            if n == 0:
                raise CollectiveError(f"previous rank {self._prev_name} closed the "
                                      "connection")
            done += n
            if n < end - start:
                break
        return done


class CommWorker:
    """The communication stream: all-reduces gradient buckets in order while compute goes on.

    Frameworks (PyTorch DDP, Horovod) start a bucket's all-reduce as soon as its gradients are
    ready and overlap it with the backward pass of the layers still to go, so only the last
    bucket's all-reduce is fully exposed. A thread gives the same overlap: the main thread
    sleeps the next compute part while this one moves bytes on the same connections.
    """

    def __init__(self, link: RingLink, buckets: list[memoryview]) -> None:
        self._link, self._buckets = link, buckets
        self._todo: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[tuple[float, float] | BaseException] = queue.SimpleQueue()
        # Daemon: a SIGTERM in the main thread must not wait for an all-reduce to finish.
        self._thread = threading.Thread(target=self._run, name="comm", daemon=True)
        self._thread.start()

    def submit(self, bucket: int) -> None:
        self._todo.put(bucket)

    def wait(self, count: int) -> tuple[float, float]:
        """Wait for ``count`` submitted buckets; return (first send start, last completion)."""
        first = last = 0.0
        for i in range(count):
            item = self._done.get()
            if isinstance(item, BaseException):
                raise item
            if i == 0:
                first = item[0]
            last = item[1]
        return first, last

    def stop(self) -> None:
        self._todo.put(None)

    def _run(self) -> None:
        while (bucket := self._todo.get()) is not None:
            try:
                t0 = now()
                self._link.allreduce(self._buckets[bucket])
                self._done.put((t0, now()))
            except Exception as exc:  # handed to the main thread, which reports it
                self._done.put(exc)
                return


class RingRank:
    """One training rank: compute, ring All-Reduce, barrier; ``--steps`` times."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.link = RingLink(args.rank, args.world, args.io_timeout_s)
        bucket_bytes = args.size // args.buckets
        # Preallocated once: the steady state allocates nothing and copies nothing in Python.
        self.buckets = [memoryview(bytearray(bucket_bytes)) for _ in range(args.buckets)]
        #: A size sweep (``--sizes``): one buffer per size, ``--steps`` steps each, in order.
        self.sweep = [memoryview(bytearray(size)) for size in args.sizes or []]
        self.rng = random.Random(args.seed + args.rank)
        self.steps: list[dict[str, Any]] = []
        self.connections: list[dict[str, Any]] = []
        self.listener: socket.socket | None = None
        self.worker: CommWorker | None = None
        self.epoch = -1
        self.conn: dict[str, Any] | None = None
        self.cc: str | None = args.cc
        self.t_ready: float | None = None
        self.loader: Loader | None = None
        self.live = LiveParts(args.live_file, args.rank)
        if args.storage:
            self.loader = Loader.from_args(args, args.bind,
                                           args.steps * max(1, len(self.sweep)))

    # -- connections ---------------------------------------------------------------------------

    def _open_epoch(self, epoch: int) -> None:
        """Connect to the next rank from this epoch's source port; accept the previous rank's."""
        a = self.args
        deadline = now() + a.connect_timeout_s
        t_open = now()
        out = connect((a.bind, a.sports[epoch]), a.next, a.cc, deadline, "next rank")
        assert self.listener is not None
        try:
            inp, _peer = accept(self.listener, deadline, "the previous rank")
        except BaseException:
            out.close()
            raise
        self.link.attach(out, inp)
        self.epoch = epoch
        self.conn = connection_record(epoch, out, t_open)
        self.cc = congestion_control(out)

    def _close_epoch(self, graceful: bool = True) -> None:
        """Record the outgoing connection's TCP_INFO, then close both connections."""
        if self.link.out is not None and self.conn is not None:
            finish_connection(self.conn, self.link.out, graceful)
            self.connections.append(self.conn)
        for sock in (self.link.out, self.link.inp):
            if sock is not None:
                sock.close()
        self.link.out = self.link.inp = None
        self.conn = None

    # -- steps ---------------------------------------------------------------------------------

    def _compute_time(self) -> float:
        """This step's compute: jittered like real kernels, longer on the straggler rank."""
        a = self.args
        t = max(0.0, a.compute_s + self.rng.uniform(-a.jitter_s, a.jitter_s))
        return t + (a.straggler_s if a.rank == a.straggler_rank else 0.0)

    def _communicate(self, t_start: float, compute: float) -> tuple[float, float, float]:
        """Compute (sleep) and all-reduce; return (compute end, comm start, comm end)."""
        if self.worker is None:  # no overlap: inline, so no thread hand-off shows in the times
            _sleep_until(t_start + compute)
            t_compute_end = now()
            self.link.allreduce(self.buckets[0])
            return t_compute_end, t_compute_end, now()
        parts = len(self.buckets)
        for b in range(parts - 1):
            _sleep_until(t_start + compute * (b + 1) / parts)
            self.worker.submit(b)
        _sleep_until(t_start + compute)
        t_compute_end = now()  # before the last bucket leaves: comm then ends after compute
        self.worker.submit(parts - 1)
        t_comm_start, t_comm_end = self.worker.wait(parts)
        return t_compute_end, t_comm_start, t_comm_end

    def _step(self, step: int, epoch: int) -> dict[str, Any]:
        """One training step and its JSON entry (times, and retransmits during the step)."""
        assert self.link.out is not None
        warmup = step < self.args.warmup
        if self.sweep:                     # this step's size: one buffer, no buckets
            per = self.args.steps
            self.buckets = [self.sweep[step // per]]
            warmup = step % per < self.args.warmup
        retrans0 = tcp_u32(self.link.out, TOTAL_RETRANS_OFFSET)
        got = wait_for_batch(self.loader, self.args.io_timeout_s,
                             lambda t: self.live.enter("data_wait", t))
        t_start, t_batch = got.t_start, got.t_batch
        self.live.enter("compute", t_batch)
        t_compute_end, t_comm_start, t_comm_end = self._communicate(t_batch, self._compute_time())
        self.live.enter("exposed_comm", t_compute_end)
        self.live.enter("barrier", t_comm_end)
        self.link.barrier()
        t_end = now()
        self.live.enter(None, t_end)
        compute_s, step_s = t_compute_end - t_batch, t_end - t_start
        entry = {
            "step": step, "epoch": epoch, "warmup": warmup,
            "size_bytes": len(self.buckets) * len(self.buckets[0]),
            "t_start": stamp(t_start), "t_compute_end": stamp(t_compute_end),
            "t_comm_start": stamp(t_comm_start), "t_comm_end": stamp(t_comm_end),
            "t_end": stamp(t_end),
            "compute_s": stamp(compute_s), "comm_s": stamp(t_comm_end - t_comm_start),
            "barrier_s": stamp(t_end - t_comm_end), "step_s": stamp(step_s),
            "idle_s": stamp(step_s - compute_s),
            "retrans": tcp_u32(self.link.out, TOTAL_RETRANS_OFFSET) - retrans0,
        }
        # with a batch, the decomposition: the four parts (STEP_PARTS) add up to step_s
        return entry | got.parts(t_comm_end - t_compute_end)

    def run(self) -> None:
        """Listen, connect, line up with the other ranks, then run every step."""
        a = self.args
        if self.loader is not None:  # first: its workers are forked, and no thread runs yet
            self.loader.start(now() + a.connect_timeout_s)
            self.loader.prime()
        self.listener = listen(a.listen, backlog=16)
        if a.buckets > 1:
            self.worker = CommWorker(self.link, self.buckets)
        self._open_epoch(0)
        self.link.barrier()  # every rank starts step 0 together
        self.t_ready = now()
        for step in range(a.steps * max(1, len(self.sweep))):
            epoch = step // a.epoch_steps if a.epoch_steps else 0
            if epoch != self.epoch:
                # A new epoch re-rolls the ECMP hash (new source port), like a job restart or a
                # new queue pair; the barrier lines the ranks up again, outside step time.
                self._close_epoch()
                self._open_epoch(epoch)
                self.link.barrier()
            self.steps.append(self._step(step, epoch))
        self._close_epoch()
        if self.loader is not None:
            self.loader.finish()
        self.live.finish()

    def close(self) -> None:
        """Clean up after a normal end or a failure: record the open connection, close all."""
        self._close_epoch(graceful=False)
        if self.loader is not None:
            self.loader.stop()
        if self.worker is not None:
            self.worker.stop()
        if self.listener is not None:
            self.listener.close()

    def summary(self, error: str | None) -> dict[str, Any]:
        a = self.args
        return {
            "mode": "ring", "rank": a.rank, "world": a.world, "size_bytes": a.size,
            "sizes": a.sizes or [],
            "buckets": a.buckets, "cc": self.cc, "clock": "monotonic",
            "listen": fmt_addr(a.listen), "next": fmt_addr(a.next), "steps_requested": a.steps,
            "compute_s": a.compute_s, "jitter_s": a.jitter_s, "seed": a.seed,
            "straggler_rank": a.straggler_rank, "straggler_s": a.straggler_s,
            "epoch_steps": a.epoch_steps, "warmup": a.warmup,
            "t_ready": None if self.t_ready is None else stamp(self.t_ready),
            "steps": self.steps, "connections": self.connections,
            "loader": None if self.loader is None else self.loader.summary(),
            "cpu_s": cpu_s(), "live_writes": self.live.file.writes, "error": error,
        }
