"""Synthetic GPU workers: training steps whose end waits for the network.

``python -m lab.agents.worker ring`` is one data-parallel training rank (one "GPU"). Every step it
computes (sleeps), all-reduces its gradients with a **ring All-Reduce** over real TCP, then joins
a barrier - the pattern of NCCL's ring algorithm. A ring All-Reduce cannot finish before its
slowest hop has carried its share, so one congested or ECMP-collided link stalls *every* GPU;
that is what the lab reproduces and measures. ``incast-sink``/``incast-send`` reproduce the
synchronised many-to-one phase of collectives: M senders answer one "go" at the same instant
and the sink's step ends with the last byte.

Every connection's 5-tuple is fixed on the command line (``--bind`` plus ``--sports``/``--sport``)
so the lab can count each connection's packets on every switch before the run starts.
Timestamps are absolute ``time.monotonic()`` seconds: one clock for every network namespace of
the machine, so the lab can line ranks up against each other and against switch counters.

Command lines::

    python -m lab.agents.worker ring --rank R --world N --listen IP:PORT --next IP:PORT \\
        --bind IP --sports P1[,P2...] --size BYTES --steps K [--warmup 1] [--compute-s 0.1] \\
        [--jitter-s 0] [--seed 0] [--straggler-rank -1] [--straggler-s 0] [--buckets 1] \\
        [--epoch-steps 0] [--cc NAME] [--connect-timeout-s 30] [--io-timeout-s 60] [--out FILE] \\
        [--storage IP:PORT[,IP:PORT...] --loader-sports P1[,P2...] [--loader-workers 1] \\
        [--prefetch 2] [--batch-bytes 262144] [--cpu-ms 0]]
    python -m lab.agents.worker incast-sink --listen IP:PORT --senders M --burst BYTES \\
        --steps K [--gap-s 0.05] [--connect-timeout-s 30] [--io-timeout-s 60] [--out FILE]
    python -m lab.agents.worker incast-send --connect IP:PORT --bind IP --sport P [--cc NAME] \\
        [--connect-timeout-s 30] [--io-timeout-s 60] [--out FILE]
    python -m lab.agents.worker gloo --rank R --world N --master IP:PORT --peers IP,IP,... \\
        --iface NAME --size BYTES --steps K --conns-out FILE --ready-file FILE [--warmup 1] \\
        [--compute-s 0.1] [--jitter-s 0] [--seed 0] [--straggler-rank -1] [--straggler-s 0] \\
        [--epoch-steps 0] [--connect-timeout-s 30] [--io-timeout-s 60] [--out FILE]

``gloo`` is the same training rank on PyTorch's gloo (:mod:`lab.agents.gloorank`): the
library, not the lab, opens and numbers its connections, and the rank reports them.
``ddp`` takes gloo's arguments (no ``--sizes``) plus ``--bucket-cap-mb MB`` and
``--first-bucket-mb MB``: a real ``DistributedDataParallel`` training rank on gloo
(:mod:`lab.agents.ddprank`) whose model's gradients total ``--size`` bytes. It takes the
ring's input pipeline flags too (``--storage`` ... ``--loader-bind``, default: its own
``--peers`` address), and a step with a batch has the ring's four parts; and the ring's
``--live-file``.

Each writes one JSON document to ``--out`` (default stdout) when it ends - also when stopped by
SIGTERM/SIGINT or failing, with ``error`` saying why. Exit status: 0 done; 1 the run broke (a
peer vanished, a timeout; one line on stderr, no traceback); 2 bad input (one line on stderr
naming the field, nothing started, no JSON); 128+signal when stopped by a signal.

Ring JSON: ``mode: "ring"``, ``rank``, ``world``, ``size_bytes``, ``buckets``, ``cc`` (the
congestion control in use), ``clock: "monotonic"``, ``t_ready`` (start barrier done), ``cpu_s``,
``live_writes`` (rewrites of ``--live-file``, 0 without one),
``error`` (null or a sentence), the run's parameters, and

* ``steps``: ``step``, ``epoch``, ``warmup``, absolute ``t_start``, ``t_compute_end``,
  ``t_comm_start`` (first bucket's first send), ``t_comm_end`` (last bucket done), ``t_end``
  (barrier done); ``compute_s``, ``comm_s`` = t_comm_end − t_comm_start, ``barrier_s`` =
  t_end − t_comm_end, ``step_s``, ``idle_s`` = step_s − compute_s (the GPU not computing), and
  ``retrans`` (segments retransmitted on the outgoing connection during the step). Without
  overlap step_s = compute_s + comm_s + barrier_s; with ``--buckets`` > 1 comm overlaps compute.
  With an input pipeline (``--storage``) a step starts by waiting for its batch, and adds
  ``t_batch`` (batch in hand; compute starts then), ``data_wait_s`` = t_batch − t_start,
  ``exposed_comm_s`` = t_comm_end − t_compute_end (the all-reduce beyond the compute's end:
  all of comm_s without overlap) and ``batch`` (``index``, ``worker``, ``queue_depth``: batches
  ready over all loader workers when the rank asked, 0 = the queue was empty; ``ready``: this
  batch was in hand at the ask; ``fetch_s``, ``prep_cpu_s``, ``prep_wall_s``, ``t_ready``).
  compute_s is then t_compute_end − t_batch, and step_s = data_wait_s + compute_s +
  exposed_comm_s + barrier_s exactly: the data wait, the GPU computing, the network holding
  the GPU, and the wait for the slowest rank.
* ``loader``: null without ``--storage``; else ``workers``, ``prefetch``, ``batch_bytes``,
  ``cpu_ms``, ``storage``, ``steps``, ``queue_empty_steps`` (steps whose ask found no batch
  ready), ``data_wait_s`` (total), and ``per_worker``: ``worker``, ``pid``, ``storage``,
  ``batches`` and ``bytes`` taken by the rank, ``fetch_s``, ``prep_cpu_s`` (preprocessing CPU
  the worker measured), ``prep_wall_s`` (the same preprocessing in wall time: longer on a busy
  host), ``cpu_s`` (the whole worker process, from the kernel), ``exit`` (its exit status;
  −9: killed), and its storage connection as in ``connections`` (no ``epoch``). Worker i
  connects from ``--loader-bind`` (default ``--bind``) and the i-th ``--loader-sports`` port
  to storage host i mod S,
  each a ``storage serve`` (:mod:`lab.agents.storage`) answering batch requests. Batch i comes
  from worker i mod N; ``--prefetch`` K batches are requested per worker (PyTorch's
  ``prefetch_factor``), each worker fetches ``--batch-bytes`` then burns ``--cpu-ms`` of CPU.
* ``connections``: one per epoch, the connection this rank opened to the next rank (all the
  data it sends): ``epoch``, ``src``, ``sport``, ``dst``, ``dport``, ``t_open``, ``t_close``,
  ``cc`` and the TCP_INFO fields of :data:`lab.agents.common.TCP_INFO_FIELDS` read just
  before closing (``retransmits``, ``bytes_acked``, ``rtt_us``, ``snd_cwnd``, ``ce_seen``,
  ...).

Incast sink JSON: ``mode: "incast"``, ``role: "sink"``, ``senders``, ``burst_bytes``, ``gap_s``,
``sender_addrs`` (``src``/``sport``, sorted by address), ``steps`` (``step``, ``t_start`` = the
"go", ``t_end`` = last byte, ``step_s``, ``per_sender_s`` in sender_addrs order,
``goodput_mbps``), ``cpu_s``, ``error``. Sender JSON: ``role: "sender"``, its 5-tuple,
``burst_bytes`` (learnt from the sink), ``steps`` (``t_go``, ``t_written``), ``connections``
(one entry, as in the ring), ``cpu_s``, ``error``.

Kernel knobs that shape the result (``net.ipv4.tcp_slow_start_after_idle`` above all: a compute
gap is "idle") are the lab's to set per namespace, not this program's.

This module is the command line only: the rank is :mod:`lab.agents.ring`, the sink and sender
:mod:`lab.agents.incast`, and what they share (clock, fixed 5-tuples, connection records)
:mod:`lab.agents.workerbase`.
"""

from __future__ import annotations

import argparse
import math
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

from lab.agents.common import StopRequestedError, catch_signals, ignore_signals, write_json
from lab.agents.ddprank import SPLIT_BYTES, DDPRank
from lab.agents.gloorank import ELEMENT_BYTES, GlooRank
from lab.agents.incast import IncastSender, IncastSink
from lab.agents.ring import RingRank
from lab.agents.workerbase import CollectiveError

#: Exit status of a run that broke (peer gone, timeout) and of bad input.
EXIT_FAILED, EXIT_USAGE = 1, 2


class UsageError(Exception):
    """Bad input: reported as one line naming the field, exit status 2, nothing started."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")


class _Worker(Protocol):
    """What the command line needs of a ring rank, an incast sink or a sender."""

    def run(self) -> None: ...
    def close(self) -> None: ...
    def summary(self, error: str | None) -> dict[str, Any]: ...


def _run_and_report(worker: _Worker, out: str | None, who: str) -> int:
    """Run, always clean up and write the JSON; turn failures into one line and an exit status."""
    error: str | None = None
    code = 0
    catch_signals()
    try:
        try:
            worker.run()
        finally:
            ignore_signals()
            worker.close()
    except StopRequestedError as exc:
        error, code = f"stopped by {exc}", 128 + signal.Signals[str(exc)].value
    except CollectiveError as exc:
        error, code = str(exc), EXIT_FAILED
    except OSError as exc:
        error, code = f"{type(exc).__name__}: {exc.strerror or exc}", EXIT_FAILED
    except Exception as exc:  # a bug: keep the traceback, still write what we have
        traceback.print_exc()
        error, code = f"internal error: {type(exc).__name__}: {exc}", EXIT_FAILED
    write_json(worker.summary(error), out)
    if error:
        print(f"{who}: {error}", file=sys.stderr)
    return code


def _addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    try:
        socket.inet_aton(host)
        value = int(port)
    except (OSError, ValueError):
        raise argparse.ArgumentTypeError(f"expected IP:PORT, got {text!r}") from None
    if not sep or not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"expected IP:PORT, got {text!r}")
    return host, value


def _ports(text: str) -> list[int]:
    try:
        ports = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected P1,P2,..., got {text!r}") from None
    return ports


def _ips(text: str) -> list[str]:
    ips = [p.strip() for p in text.split(",") if p.strip()]
    for ip in ips:
        try:
            socket.inet_aton(ip)
        except OSError:
            raise argparse.ArgumentTypeError(f"expected IP1,IP2,..., got {text!r}") from None
    return ips


def _addrs(text: str) -> list[tuple[str, int]]:
    return [_addr(part.strip()) for part in text.split(",") if part.strip()]


def _check_cc(cc: str | None) -> None:
    """An unknown congestion control is bad input: say so before anything starts."""
    if not cc:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
        except OSError as exc:
            raise UsageError("cc", f"{cc!r} cannot be used here ({exc.strerror}); see "
                             "net.ipv4.tcp_available_congestion_control") from None


def _check_common(a: argparse.Namespace) -> None:
    if a.connect_timeout_s <= 0:
        raise UsageError("connect_timeout_s", "must be > 0")
    if a.io_timeout_s <= 0:
        raise UsageError("io_timeout_s", "must be > 0")
    _check_cc(getattr(a, "cc", None))


def validate_ring(a: argparse.Namespace) -> None:
    """Reject impossible rings before any socket exists (exit 2, one line naming the field)."""
    if a.world < 2:
        raise UsageError("world", f"a ring needs at least 2 ranks, got {a.world}")
    if not 0 <= a.rank < a.world:
        raise UsageError("rank", f"must be in 0..{a.world - 1}, got {a.rank}")
    if a.buckets < 1:
        raise UsageError("buckets", f"must be >= 1, got {a.buckets}")
    if a.size <= 0 or a.size % (a.world * a.buckets):
        raise UsageError("size_bytes", f"{a.size} must be a positive multiple of "
                         f"world*buckets = {a.world * a.buckets} (equal chunks per bucket)")
    if a.steps < 1:
        raise UsageError("steps", f"must be >= 1, got {a.steps}")
    _check_sizes(a, a.world, "multiple of world = {m}")
    if a.sizes and a.buckets != 1:
        raise UsageError("buckets", "a size sweep runs one bucket per step")
    if a.warmup < 0:
        raise UsageError("warmup", f"must be >= 0, got {a.warmup}")
    if a.epoch_steps < 0:
        raise UsageError("epoch_steps", f"must be >= 0, got {a.epoch_steps}")
    for name in ("compute_s", "jitter_s", "straggler_s"):
        if getattr(a, name) < 0:
            raise UsageError(name, f"must be >= 0, got {getattr(a, name)}")
    if not -1 <= a.straggler_rank < a.world:
        raise UsageError("straggler_rank", f"must be -1 (none) or 0..{a.world - 1}")
    epochs = math.ceil(a.steps / a.epoch_steps) if a.epoch_steps else 1
    if not a.sports:
        raise UsageError("sports", f"missing: --sports P1,... ({epochs} source port(s), one "
                         "per epoch)")
    if len(a.sports) < epochs:
        raise UsageError("sports", f"{len(a.sports)} source port(s) given, {a.steps} steps in "
                         f"epochs of {a.epoch_steps} need {epochs}")
    if len(set(a.sports)) != len(a.sports) or not all(0 < p < 65536 for p in a.sports):
        raise UsageError("sports", f"must be distinct ports 1..65535, got {a.sports}")
    _check_loader(a)
    _check_common(a)


def _check_loader(a: argparse.Namespace) -> None:
    """The input pipeline's options: one source port per worker, none shared with the ring."""
    if not a.storage:
        if a.loader_sports:
            raise UsageError("loader_sports", "given without --storage (no loader to use them)")
        return
    for name in ("loader_workers", "prefetch", "batch_bytes"):
        if getattr(a, name) < 1:
            raise UsageError(name, f"must be >= 1, got {getattr(a, name)}")
    if not a.cpu_ms >= 0:
        raise UsageError("cpu_ms", f"must be >= 0, got {a.cpu_ms}")
    sports = a.loader_sports or []
    if len(sports) != a.loader_workers:
        raise UsageError("loader_sports", f"{len(sports)} source port(s) given for "
                         f"{a.loader_workers} loader worker(s): one each")
    if len(set(sports)) != len(sports) or not all(0 < p < 65536 for p in sports):
        raise UsageError("loader_sports", f"must be distinct ports 1..65535, got {sports}")
    if shared := set(sports) & set(getattr(a, "sports", None) or []):
        raise UsageError("loader_sports", f"{sorted(shared)} also in --sports (one 5-tuple, "
                         "one connection)")


def _check_sizes(a: argparse.Namespace, multiple: int, what: str) -> None:
    """A sweep's sizes: each a positive multiple the library can split."""
    for size in a.sizes or []:
        if size <= 0 or size % multiple:
            raise UsageError("sizes", f"{size} must be a positive " + what.format(m=multiple))
    if a.sizes and a.epoch_steps:
        raise UsageError("epoch_steps", "a size sweep keeps its connections (0)")


def validate_gloo(a: argparse.Namespace) -> None:
    """Reject impossible gloo jobs before torch is even imported (exit 2, the field named)."""
    if a.world < 2:
        raise UsageError("world", f"an All-Reduce needs at least 2 ranks, got {a.world}")
    if not 0 <= a.rank < a.world:
        raise UsageError("rank", f"must be in 0..{a.world - 1}, got {a.rank}")
    if a.size <= 0 or a.size % ELEMENT_BYTES:
        raise UsageError("size_bytes", f"{a.size} must be a positive multiple of "
                         f"{ELEMENT_BYTES} (gloo reduces float32 elements)")
    _check_sizes(a, ELEMENT_BYTES, "multiple of {m} (float32 elements)")
    if len(a.peers) != a.world:
        raise UsageError("peers", f"{len(a.peers)} addresses given for {a.world} ranks")
    for name in ("steps",):
        if getattr(a, name) < 1:
            raise UsageError(name, f"must be >= 1, got {getattr(a, name)}")
    for name in ("warmup", "epoch_steps", "compute_s", "jitter_s", "straggler_s"):
        if getattr(a, name) < 0:
            raise UsageError(name, f"must be >= 0, got {getattr(a, name)}")
    if not -1 <= a.straggler_rank < a.world:
        raise UsageError("straggler_rank", f"must be -1 (none) or 0..{a.world - 1}")
    if not a.iface:
        raise UsageError("iface", "the fabric interface gloo must use (GLOO_SOCKET_IFNAME)")
    a.epochs = math.ceil(a.steps / a.epoch_steps) if a.epoch_steps else 1
    _check_common(a)


def validate_ddp(a: argparse.Namespace) -> None:
    """gloo's checks, and a gradient size the model can be built to: exit 2 naming the field."""
    validate_gloo(a)
    if a.size % SPLIT_BYTES:
        raise UsageError("size_bytes", f"{a.size} must be a multiple of {SPLIT_BYTES} (the "
                         "model's blocks of float32 matrices)")
    for name in ("bucket_cap_mb", "first_bucket_mb"):
        if not getattr(a, name) > 0:
            raise UsageError(name, f"must be > 0, got {getattr(a, name)}")
    _check_loader(a)


def validate_incast(a: argparse.Namespace) -> None:
    if a.cmd == "incast-sink":
        for name, value in (("senders", a.senders), ("burst", a.burst), ("steps", a.steps)):
            if value < 1:
                raise UsageError(name, f"must be >= 1, got {value}")
        if a.gap_s < 0:
            raise UsageError("gap_s", f"must be >= 0, got {a.gap_s}")
    elif not 0 < a.sport < 65536:
        raise UsageError("sport", f"must be 1..65535, got {a.sport}")
    _check_common(a)


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (the lab logs one line per failed worker)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _common_flags() -> argparse.ArgumentParser:
    """Every worker's flags: its time-outs and where its summary goes."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--connect-timeout-s", type=float, default=30.0,
                   help="give up connecting/accepting after this long (peers start late)")
    p.add_argument("--io-timeout-s", type=float, default=60.0,
                   help="give up when no byte moves for this long")
    p.add_argument("--out", help="JSON summary file (default: stdout)")
    return p


def _rank_flags() -> argparse.ArgumentParser:
    """A training rank's flags, the same on the synthetic ring, gloo and DDP: who it is,
    the job's size and steps, and its modelled compute (jitter, a straggler)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True, help="number of ranks N")
    p.add_argument("--size", type=int, required=True, help="gradient bytes per step")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--warmup", type=int, default=1, help="first steps marked warmup")
    p.add_argument("--compute-s", type=float, default=0.1)
    p.add_argument("--jitter-s", type=float, default=0.0, help="compute ± uniform jitter")
    p.add_argument("--seed", type=int, default=0, help="jitter RNG seed (+ rank)")
    p.add_argument("--straggler-rank", type=int, default=-1)
    p.add_argument("--straggler-s", type=float, default=0.0)
    return p


def _gloo_flags() -> argparse.ArgumentParser:
    """What a rank on gloo adds (the all-reduce job's and DDP's): rendezvous, peers, and
    where its connections and readiness are written."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--master", type=_addr, required=True,
                   help="rank 0's fabric IP:PORT: the rendezvous (init_method=tcp://...)")
    p.add_argument("--peers", type=_ips, required=True,
                   help="every rank's fabric IP, in rank order: names a connection's peer")
    p.add_argument("--iface", required=True, help="the fabric interface (GLOO_SOCKET_IFNAME)")
    p.add_argument("--epoch-steps", type=int, default=0,
                   help="a new process group (new connections) every E steps (0: never)")
    p.add_argument("--conns-out", required=True,
                   help="where gloo's connections are written once rendezvous is done")
    p.add_argument("--ready-file", required=True, help="written once ready for the go")
    return p


def _sweep_flag() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--sizes", type=_ports, help="a size sweep: --steps steps of each of "
                   "these gradient sizes in bytes, in order (--size is then unused)")
    return p


def _live_flag() -> argparse.ArgumentParser:
    """A training rank's live view (the synthetic ring's and DDP's)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--live-file", help="rewrite this JSON file with the rank's recent step "
                   "parts as spans, at most every 0.5 s (for a live view)")
    return p


def _loader_flags() -> argparse.ArgumentParser:
    """A training rank's input pipeline (:mod:`lab.agents.loader`), modelled on PyTorch's
    DataLoader: the synthetic ring's and DDP's ranks take the same flags."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--storage", type=_addrs, help="storage hosts IP:PORT,... serving batches "
                   "(storage serve): gives the rank a data loader")
    p.add_argument("--loader-workers", type=int, default=1,
                   help="loader worker processes (num_workers)")
    p.add_argument("--prefetch", type=int, default=2,
                   help="batches requested ahead per worker (prefetch_factor)")
    p.add_argument("--batch-bytes", type=int, default=256 * 1024,
                   help="bytes a worker fetches per batch")
    p.add_argument("--cpu-ms", type=float, default=0.0,
                   help="CPU milliseconds a worker burns preprocessing a batch")
    p.add_argument("--loader-sports", type=_ports,
                   help="source ports of the workers' storage connections, one per worker")
    p.add_argument("--loader-bind",
                   help="source IP of the storage connections (default: the ring's --bind, "
                   "DDP's own --peers address); the job's own connections may use another "
                   "interface than its input's")
    return p


def build_parser() -> argparse.ArgumentParser:
    """The workers' subcommands, built from parent parsers so that a flag two workers
    share is defined once."""
    parser = _Parser(prog="collective", description=__doc__.split("\n\n", 1)[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    common, rank, gloo, sweep = _common_flags(), _rank_flags(), _gloo_flags(), _sweep_flag()
    loader, live = _loader_flags(), _live_flag()

    ring = sub.add_parser("ring", help="one rank of a ring All-Reduce training job",
                          parents=[rank, sweep, loader, live, common])
    ring.add_argument("--listen", type=_addr, required=True, help="IP:PORT for the previous rank")
    ring.add_argument("--next", type=_addr, required=True, help="the next rank's IP:PORT")
    ring.add_argument("--bind", required=True, help="source IP of the connection to next")
    ring.add_argument("--sports", type=_ports, help="source ports, one per epoch: P1,P2,...")
    ring.add_argument("--buckets", type=int, default=1, help="gradient buckets (overlap)")
    ring.add_argument("--epoch-steps", type=int, default=0,
                      help="reconnect from the next source port every E steps (0: never)")
    ring.add_argument("--cc", help="TCP congestion control (default: the system's)")

    sub.add_parser("gloo", help="one rank of the same job on PyTorch's gloo",
                   parents=[rank, gloo, sweep, common])

    ddp = sub.add_parser("ddp", help="one rank of a DistributedDataParallel job on gloo",
                         parents=[rank, gloo, loader, live, common])
    ddp.add_argument("--bucket-cap-mb", type=float, default=25.0,
                     help="DDP's bucket size (its default: 25 MB)")
    ddp.add_argument("--first-bucket-mb", type=float, default=1.0,
                     help="DDP's first bucket's size (its default: 1 MB)")
    ddp.set_defaults(sizes=None)

    sink = sub.add_parser("incast-sink", help="receiver of synchronised many-to-one bursts",
                          parents=[common])
    sink.add_argument("--listen", type=_addr, required=True)
    sink.add_argument("--senders", type=int, required=True)
    sink.add_argument("--burst", type=int, required=True, help="bytes per sender per step")
    sink.add_argument("--steps", type=int, required=True)
    sink.add_argument("--gap-s", type=float, default=0.05, help="compute gap before each go")

    send = sub.add_parser("incast-send", help="one sender of an incast", parents=[common])
    send.add_argument("--connect", type=_addr, required=True, help="the sink's IP:PORT")
    send.add_argument("--bind", required=True)
    send.add_argument("--sport", type=int, required=True)
    send.add_argument("--cc")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "ring":
            validate_ring(args)
        elif args.cmd == "gloo":
            validate_gloo(args)
        elif args.cmd == "ddp":
            validate_ddp(args)
        else:
            validate_incast(args)
    except UsageError as exc:
        print(f"collective {args.cmd}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    factories: dict[str, Callable[[argparse.Namespace], _Worker]] = {
        "ring": RingRank, "gloo": GlooRank, "ddp": DDPRank, "incast-sink": IncastSink,
        "incast-send": IncastSender}
    who = f"collective {args.cmd}" + (f" rank {args.rank}" if args.cmd in ("ring", "gloo", "ddp")
                                      else "")
    return _run_and_report(factories[args.cmd](args), args.out, who)


if __name__ == "__main__":
    sys.exit(main())
