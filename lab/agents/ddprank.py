"""One rank of a real ``DistributedDataParallel`` training job on gloo:
``python -m lab.agents.worker ddp``.

:mod:`lab.agents.gloorank` all-reduces one tensor of S bytes per step; this trains a model
whose gradients total S bytes, and PyTorch's DDP decides what crosses the network and when:
it groups the gradients into buckets of at most ``--bucket-cap-mb``, the first of them (the
last layers' gradients, the first backward produces) of at most ``--first-bucket-mb``
(DDP's ``dist._DEFAULT_FIRST_BUCKET_BYTES``, 1 MiB unless set), in the order backward
produces them, and all-reduces each bucket as soon as its gradients are ready, while
backward goes on computing the earlier layers. How much of the communication hides behind
backward is what bucketing buys. DDP's first iteration runs in one bucket, then DDP rebuilds
its buckets in the order it saw the gradients, at the start of the second iteration's
forward, where rank 0 broadcasts that order to every rank: each epoch's model runs both
iterations before the lab's go, as set-up, so every measured step is bucketed as training
goes on and no measured forward holds a collective (it would wait there for the slowest
rank, a wait counted as compute).

The model: ``BLOCKS`` blocks of ``Linear(WIDTH, m) -> ReLU -> Linear(m, WIDTH)`` (no
biases), m chosen so that the parameters are exactly S / 4 float32s; synthetic data, one
fixed batch of ``BATCH`` samples per rank; MSE loss; SGD. Its arithmetic is a few ms on one
thread, so N ranks leave the emulated network its two cores. The GPU time a real model
would take is ``--compute-s`` per step (with ``--jitter-s`` and the straggler's
``--straggler-s``, as the gloo rank's), modelled as the synthetic ring and the gloo rank
model it, by sleeping (a GPU's compute does not take the host's CPU): a third in forward,
two thirds in backward (backward costs about twice forward), spread over the blocks, so
the buckets become ready one after another during backward as they would on a GPU.

Timing comes from DDP's own communication hook (``register_comm_hook``), which DDP calls
once per bucket when that bucket is ready: the hook stamps the bucket's start, starts
gloo's ``all_reduce`` (async), and stamps its end when gloo's future completes. Per step:
``fwd_s`` (forward), ``bwd_s`` (backward's compute: from its start to the last bucket
ready), ``comm_s`` (first bucket's start to last bucket's end), ``overlap`` (the share of
the buckets' communication, their union, that fell inside backward's compute),
``exposed_comm_s`` (from backward's compute end until backward returned: the GPU waiting
for the network), ``opt_s`` (optimizer step) and ``idle_s`` = step_s - (fwd + bwd + opt).

With ``--storage`` the rank has the synthetic ring's input pipeline
(:class:`lab.agents.loader.Loader`) and a step first waits for its batch: the step is then
``data_wait_s`` (from the step's start to the batch in hand), ``compute_s`` (forward,
backward's compute and the optimizer step), ``exposed_comm_s`` and ``barrier_s`` (0: DDP
has no barrier; a slower rank shows as the others' exposed communication, the all-reduce
waiting for its buckets), the ring's parts (:data:`lab.agents.loader.STEP_PARTS`) under
the ring's keys, adding up to ``step_s``. The loader's workers are forked before torch is
imported (torch starts threads; a fork must not copy their locks) and ask for no batch
before the lab's go, so the switches count every batch from its first byte.

With ``--live-file`` the rank writes its parts as spans for a live view, as the ring's rank
does (:class:`lab.agents.workerbase.LiveParts`): its exposed part and optimizer step once
backward has returned (the hook says when backward's compute ended only then).

Everything else (rendezvous on rank 0's fabric address, gloo's connections reported before
the lab's go, epochs as process groups, bounded threads, the JSON) is the gloo rank's.

This runs inside hosts: the standard library and torch, nothing of the lab.
"""

from __future__ import annotations

import argparse
import copy
from typing import Any

from lab.agents import golatch
from lab.agents.common import write_json
from lab.agents.gloorank import ELEMENT_BYTES, GlooRank
from lab.agents.loader import Loader, wait_for_batch
from lab.agents.workerbase import CollectiveError, LiveParts, now, stamp

#: The model's shape: BLOCKS blocks of WIDTH -> m -> WIDTH (two weight matrices each).
BLOCKS = 4
WIDTH = 64
#: Synthetic samples per rank per step.
BATCH = 16
#: S must be a multiple of this: BLOCKS blocks of two WIDTH x m float32 matrices.
SPLIT_BYTES = BLOCKS * 2 * WIDTH * ELEMENT_BYTES
#: Share of --compute-s slept in forward (the rest in backward: about twice forward).
FORWARD_SHARE = 1 / 3


def hidden_width(size_bytes: int) -> int:
    """m such that BLOCKS blocks of two WIDTH x m matrices hold size_bytes of float32."""
    return size_bytes // SPLIT_BYTES


def union_s(spans: list[tuple[float, float]]) -> float:
    """Length of the union of [a, b) intervals (buckets' all-reduces may run together)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def overlap_share(spans: list[tuple[float, float]], t0: float, t1: float) -> float:
    """Share of the spans' union that falls inside [t0, t1] (0 when there is no span)."""
    whole = union_s(spans)
    if whole <= 0:
        return 0.0
    inside = union_s([(max(a, t0), min(b, t1)) for a, b in spans if min(b, t1) > max(a, t0)])
    return inside / whole


class DDPRank(GlooRank):
    """One training rank: DDP(model) on gloo, forward, backward (buckets all-reduced by
    DDP as they become ready), optimizer step; ``--steps`` times."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.models: list[Any] = []
        self.optims: list[Any] = []
        self.buckets: list[dict[str, Any]] = []     # the current step's, from the hook
        self.bucket_bytes: list[int] = []            # the last measured step's
        self.params = 0
        self.live = LiveParts(args.live_file, args.rank)
        self.loader: Loader | None = None
        if args.storage:   # its connections from this rank's fabric address by default
            self.loader = Loader.from_args(args, args.peers[args.rank], args.steps)

    # -- the model -----------------------------------------------------------------------------

    def _build(self, torch: Any, groups: list[Any]) -> None:
        """One DDP model per epoch's process group (DDP binds to one group), same start."""
        from torch.nn.parallel import DistributedDataParallel

        a, nn = self.args, torch.nn
        m = hidden_width(a.size)
        sleep = _gpu_time(torch)
        # DDP reads its first bucket's cap from here when it builds its reducer.
        self.dist._DEFAULT_FIRST_BUCKET_BYTES = int(a.first_bucket_mb * 1024 * 1024)
        torch.manual_seed(a.seed)
        layers: list[Any] = []
        for _ in range(BLOCKS):
            layers += [nn.Linear(WIDTH, m, bias=False), nn.ReLU(), nn.Linear(m, WIDTH, bias=False)]
            layers.append(sleep(0.0, 0.0))     # set per step: _set_gpu_time
        net = nn.Sequential(*layers)
        self.params = sum(p.numel() for p in net.parameters())
        for group in groups:
            model = DistributedDataParallel(copy.deepcopy(net), process_group=group,
                        bucket_cap_mb=a.bucket_cap_mb, broadcast_buffers=False)
            # DDP checks a hook's annotations against its own types; a lambda has none.
            model.register_comm_hook(group, lambda state, bucket: self._hook(state, bucket))
            self.models.append(model)
            self.optims.append(torch.optim.SGD(model.parameters(), lr=1e-4))
        gen = torch.Generator().manual_seed(a.seed * 1000 + a.rank)
        self.x = torch.randn(BATCH, WIDTH, generator=gen)
        self.y = torch.randn(BATCH, WIDTH, generator=gen)
        for model in self.models:   # DDP's one-bucket first iteration, then its rebuild
            for _ in range(2):
                ((model(self.x) - self.y) ** 2).mean().backward()

    @staticmethod
    def _set_gpu_time(model: Any, compute_s: float) -> None:
        """This step's modelled GPU time (``--compute-s``, with the gloo rank's jitter and
        straggler), a third in forward and two thirds in backward, spread over the blocks."""
        for m in model.module:
            if hasattr(m, "bwd_s"):
                m.fwd_s = compute_s * FORWARD_SHARE / BLOCKS
                m.bwd_s = compute_s * (1 - FORWARD_SHARE) / BLOCKS

    def _hook(self, group: Any, bucket: Any) -> Any:
        """DDP's communication hook: one bucket ready; all-reduce it, stamp start and end."""
        buf = bucket.buffer()
        rec = {"bytes": int(buf.numel()) * buf.element_size(), "t_start": now(), "t_end": None}
        self.buckets.append(rec)
        world = self.args.world
        fut = self.dist.all_reduce(buf, group=group, async_op=True).get_future()

        def done(f: Any) -> Any:
            rec["t_end"] = now()
            return f.value()[0].div_(world)
        return fut.then(done)

    # -- steps ---------------------------------------------------------------------------------

    def _ddp_step(self, step: int, epoch: int) -> dict[str, Any]:
        a = self.args
        model, opt = self.models[epoch], self.optims[epoch]
        opt.zero_grad(set_to_none=False)      # before the step: not part of its time
        self._set_gpu_time(model, self._compute_time())
        self.buckets = []
        got = wait_for_batch(self.loader, a.io_timeout_s,
                             lambda t: self.live.enter("data_wait", t))
        t_start, t_batch = got.t_start, got.t_batch
        self.live.enter("compute", t_batch)
        loss = ((model(self.x) - self.y) ** 2).mean()
        t_fwd = now()
        loss.backward()
        t_bwd_ret = now()
        opt.step()
        t_end = now()
        if not self.buckets or any(b["t_end"] is None for b in self.buckets):
            raise CollectiveError(f"step {step}: DDP's hook saw no completed bucket")
        spans = [(b["t_start"], b["t_end"]) for b in self.buckets]
        t_ready = max(s for s, _ in spans)      # the last bucket ready: backward computed
        # known once backward has returned: a live view sees the exposed part a step late
        self.live.enter("exposed_comm", t_ready)
        self.live.enter("compute", t_bwd_ret)   # the optimizer step
        self.live.enter(None, t_end)
        t_c0, t_c1 = min(s for s, _ in spans), max(e for _, e in spans)
        fwd_s, bwd_s, opt_s = t_fwd - t_batch, t_ready - t_fwd, t_end - t_bwd_ret
        compute_s = fwd_s + bwd_s + opt_s
        step_s = t_end - t_start
        self.bucket_bytes = [b["bytes"] for b in self.buckets]
        return {
            "step": step, "epoch": epoch, "warmup": step < a.warmup,
            "size_bytes": sum(self.bucket_bytes),
            "t_start": stamp(t_start), "t_compute_end": stamp(t_ready),
            "t_comm_start": stamp(t_c0), "t_comm_end": stamp(t_c1), "t_end": stamp(t_end),
            "fwd_s": stamp(fwd_s), "bwd_s": stamp(bwd_s), "opt_s": stamp(opt_s),
            "compute_s": stamp(compute_s), "comm_s": stamp(t_c1 - t_c0),
            "comm_busy_s": stamp(union_s(spans)),
            "exposed_comm_s": stamp(t_bwd_ret - t_ready),
            "overlap": round(overlap_share(spans, t_fwd, t_ready), 4),
            "buckets": len(spans), "barrier_s": 0.0, "step_s": stamp(step_s),
            "idle_s": stamp(step_s - compute_s), "retrans": 0,
        } | got.parts(t_bwd_ret - t_ready)

    def run(self) -> None:
        """Rendezvous, DDP models built, gloo's connections reported, the go, every step."""
        a = self.args
        golatch.hold()
        if self.loader is not None:   # forked before torch's threads exist
            self.loader.start(now() + a.connect_timeout_s)
        torch = self._import_torch()
        groups = self._rendezvous()
        # DDP's constructor broadcasts rank 0's parameters: set-up, before the window.
        self._build(torch, groups)
        write_json({"rank": a.rank, "groups": self.groups}, a.conns_out)
        # Counters from the go (GlooRank.wait_for_go): DDP's parameter broadcast and each
        # model's first two iterations are set-up, not the measured job.
        self.wait_for_go()
        if self.loader is not None:           # the batches inside the lab's window
            self.loader.prime()
        self.dist.barrier(group=groups[0])     # every rank starts step 0 together
        self.t_ready = now()
        epoch = 0
        for step in range(a.steps):
            e = step // a.epoch_steps if a.epoch_steps else 0
            if e != epoch:                     # training goes on in the next group's model
                self.models[e].module.load_state_dict(self.models[epoch].module.state_dict())
                epoch = e
                self.dist.barrier(group=groups[e])
            retrans0 = self._retrans(e)
            rec = self._ddp_step(step, e)
            rec["retrans"] = self._retrans(e) - retrans0
            self.steps.append(rec)
        if self.loader is not None:
            self.loader.finish()
        self.live.finish()

    def close(self) -> None:
        """The loader's workers stopped and reaped (every way out), then gloo's close."""
        if self.loader is not None:
            self.loader.stop()
        super().close()

    def summary(self, error: str | None) -> dict[str, Any]:
        out = super().summary(error)
        a = self.args
        out["library"] = "gloo"
        out["program"] = "ddp"
        out["loader"] = None if self.loader is None else self.loader.summary()
        out["ddp"] = {"bucket_cap_mb": a.bucket_cap_mb, "first_bucket_mb": a.first_bucket_mb,
                      "grad_bytes": self.params * ELEMENT_BYTES,
                      "params": self.params, "blocks": BLOCKS, "width": WIDTH,
                      "hidden": hidden_width(a.size), "batch": BATCH,
                      "buckets": len(self.bucket_bytes), "bucket_bytes": self.bucket_bytes}
        return out


def _gpu_time(torch: Any) -> Any:
    """A module that sleeps ``fwd_s`` in forward and ``bwd_s`` in backward: the modelled
    GPU's compute for the block before it, with no CPU taken from the emulator."""
    import time

    class _Sleep(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, fwd_s: float, bwd_s: float) -> Any:
            ctx.bwd_s = bwd_s
            time.sleep(fwd_s)
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            time.sleep(ctx.bwd_s)
            return grad, None, None

    class GPUTime(torch.nn.Module):
        def __init__(self, fwd_s: float, bwd_s: float) -> None:
            super().__init__()
            self.fwd_s, self.bwd_s = fwd_s, bwd_s

        def forward(self, x: Any) -> Any:
            return _Sleep.apply(x, self.fwd_s, self.bwd_s)

    return GPUTime
