"""sync=ddp: torch's DistributedDataParallel, its bucket all-reduces
timed by a comm hook.

DDP launches each bucket's all-reduce from inside backward as soon as
the bucket is ready, so communication overlaps the rest of backward. The
hook below is DDP's default one (or torch's sync.compress hook) plus two
stamps: the start when DDP hands it a bucket, the end in the future's
completion callback, so that overlap stays real (docs/timing.md, "How
communication is timed"). `sync()` is a no-op (DDP is done when backward
returns). A world of one runs the bare model. Keys and rules:
config/sync.py.

`sync.hook` picks what runs on each bucket: torch's own hooks
(allreduce, fp16, bf16, powersgd: `sync.compress=fp16` is the same fp16
hook), or ddp_lab's collectives (ring, ring_prepost, reduce_broadcast)
inside DDP's reducer: the bucket divided by the world size, then our
send/recv algorithm on it, a completed Future back (docs/twins.md). The
hook is registered under its own name (`ddp_lab_<hook>_hook`), which
DDP's logging data records (`comm_hook`)."""

# no `from __future__ import annotations`: DDP checks the hook's
# annotations at runtime

from contextlib import nullcontext
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.nn.parallel import DistributedDataParallel as DDP

from ..collectives import (
    PlanTags,
    PrepostedRingAllReduce,
    all_reduce_ring,
    all_reduce_ring_textbook,
    broadcast_tree,
    reduce_tree,
)
from ..predict import costmodel
from .buckets import unused_parameters, WIRE_DTYPES
from .synchroniser import Synchroniser

#: sync.hook -> ddp_lab's collective calls it makes on a bucket:
#: (collective, algorithm)
OUR_HOOKS: dict[str, tuple[tuple[str, str], ...]] = {
    "ring": (("all_reduce", "ring"),),
    "ring_prepost": (("all_reduce", "ring"),),
    "reduce_broadcast": (("reduce", "tree"), ("broadcast", "tree")),
}


class DDPSync(Synchroniser):
    name = "ddp"
    # the backend's own all-reduce; bytes follow the ring model
    bytes_exact = False

    def wrap(self, module: nn.Module) -> nn.Module:
        """DDP around the model; in a world of one the model itself:
        DDP's reducer would cost 35% of a 1-rank step for nothing
        (docs/performance.md), not a bit changed."""
        if self.world_size == 1:
            return module
        cfg = self.cfg
        ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DDP(
            module,
            device_ids=ids,
            bucket_cap_mb=cfg.bucket_cap_mb,
            gradient_as_bucket_view=cfg.gradient_as_bucket_view,
            static_graph=cfg.static_graph,
            find_unused_parameters=cfg.find_unused_parameters,
        )
        self.hook = hook_name(cfg)
        self.torch_hook, self.powersgd = (
            (None, None) if self.hook in OUR_HOOKS else _torch_hook(cfg, self.hook)
        )
        # our send/recv: this rank's bytes exactly
        self.bytes_exact = self.hook in OUR_HOOKS
        # ring_prepost's, per bucket
        self.plans: dict[tuple[int, int], PrepostedRingAllReduce] = {}
        self.tags = PlanTags()
        # nccl: the batched ring (sync=ring's rule)
        self.textbook = dist.get_backend() == "gloo"
        # PowerSGD launches its P and Q all-reduces from completion
        # callbacks, on gloo from its worker threads: with several
        # buckets in flight the ranks would issue them in different
        # orders (an abort). So on gloo a bucket waits for the previous
        # one's chain.
        self.serial = self.powersgd is not None and dist.get_backend() != "nccl"
        self.inflight: Optional[torch.futures.Future] = None
        hook = _our_hook if self.hook in OUR_HOOKS else _timed_allreduce_hook
        ddp.register_comm_hook(self, _named(hook, self.hook))
        return ddp

    def close(self) -> None:
        """Collective: ring_prepost's plans answer the receives they
        keep posted."""
        for plan in getattr(self, "plans", {}).values():
            plan.close()

    def no_sync(self):
        """DDP all-reduces from inside backward: `DDP.no_sync()` keeps
        the gradients local (forward and backward must both run inside
        it); the next backward outside it all-reduces the accumulated
        sum. In a world of one (the bare model) there is nothing to hold
        back. train.compile wraps the model: DDP is the wrapped one."""
        ddp = getattr(self.wrapped, "_orig_mod", self.wrapped)
        return ddp.no_sync() if isinstance(ddp, DDP) else nullcontext()

    def preflight(self, loss_fn: Callable[[], torch.Tensor]) -> None:
        """DDP without unused-parameter detection waits forever for a
        gradient that never comes, and only says so at the next
        iteration: find out before the first step."""
        if not (self.cfg.find_unused_parameters or self.cfg.static_graph):
            # (otherwise DDP handles parameters without gradients
            # itself)
            unused = unused_parameters(self.module, loss_fn)
            if unused:
                names = ", ".join(unused[:5]) + (" ..." if len(unused) > 5 else "")
                raise ValueError(
                    f"sync=ddp: the model has parameters that get no gradient "
                    f"({names}): set sync.find_unused_parameters=true (or "
                    "sync.static_graph=true if the set never changes)"
                )
        # One forward and backward, gradients dropped: DDP lays its
        # buckets out anew after its first iteration, so without it a
        # resumed run would sum its first gradients in another order (3+
        # ranks: no bit-identical resume). Its comm is no epoch's.
        loss_fn(self.wrapped).backward()
        self.module.zero_grad(set_to_none=True)
        self.collect_comm()


def hook_name(cfg: Any) -> str:
    """The hook DDP runs: sync.hook, or with sync.hook=none the one
    sync.compress picks (the same torch hook: sync.compress=fp16 is
    sync.hook=fp16), allreduce without either."""
    hook = cfg.get("hook", "none")
    if hook != "none":
        return hook
    compress = cfg.get("compress", "none")
    return "allreduce" if compress == "none" else compress


def _named(hook: Callable, name: str) -> Callable:
    """`hook` registered under `ddp_lab_<name>_hook`: DDP's logging data
    says which one ran."""

    def named(state: "DDPSync", bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return hook(state, bucket)

    named.__name__ = named.__qualname__ = f"ddp_lab_{name}_hook"
    return named


def _our_hook(state: "DDPSync", bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """ddp_lab's collective on DDP's bucket: divided by the world size
    first (as torch's allreduce_hook does, so the sum is the average),
    then our send/recv algorithm, in place and blocking; the bucket
    handed back in a completed Future. Timed as one call whose bytes are
    our algorithm's (exact)."""
    buf = bucket.buffer()
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    if state.world_size == 1:
        fut.set_result(buf)
        return fut
    buf.div_(state.world_size)
    sent = recv = 0
    for coll, algo in OUR_HOOKS[state.hook]:
        c = costmodel.cost(coll, algo, buf.numel(), state.world_size, buf.element_size())
        sent, recv = sent + c.sent[state.rank], recv + c.recv[state.rank]
    op = "all_reduce"
    with state.comm.timed(op, buf.nbytes, sent, recv):
        if state.hook == "reduce_broadcast":
            reduce_tree(buf, 0)
            broadcast_tree(buf, 0)
        elif state.hook == "ring_prepost" and state.textbook and buf.device.type == "cpu":
            # DDP rebuilds its buckets after step one
            key = (bucket.index(), buf.numel())
            if key not in state.plans:
                # collective: same order everywhere
                state.plans[key] = PrepostedRingAllReduce(buf, tags=state.tags)
            state.plans[key](buf)
        elif state.textbook:
            all_reduce_ring_textbook(buf)
        else:
            all_reduce_ring(buf)
    fut.set_result(buf)
    return fut


def _torch_hook(cfg: Any, name: str) -> tuple[Callable, Optional[powerSGD.PowerSGDState]]:
    """torch's own comm hook `name` (sync.hook, or sync.compress:
    `hook_name`), and PowerSGD's state, which the hook keeps.

    PowerSGD's settings and why (`start_powerSGD_iter=2`: our preflight
    runs DDP's first iteration, so only the first training step is
    vanilla; its state is not in checkpoints):
    docs/compression_overlap.md, "Compression"."""
    if name == "powersgd":
        state = powerSGD.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=cfg.powersgd_rank,
            start_powerSGD_iter=2,
            min_compression_rate=2,
            use_error_feedback=True,
            warm_start=True,
            random_seed=0,
        )
        return (lambda bucket: powerSGD.powerSGD_hook(state, bucket)), state
    hook = {
        "allreduce": default_hooks.allreduce_hook,
        "fp16": default_hooks.fp16_compress_hook,
        "bf16": default_hooks.bf16_compress_hook,
    }[name]
    # None: the default (world) group
    return (lambda bucket: hook(None, bucket)), None


def _wire_calls(state: "DDPSync", bucket: dist.GradBucket, before: int) -> list[tuple[int, int]]:
    """(elements, element size) of each all-reduce torch's hook made for
    `bucket`, from torch's own rules: the bucket in the wire dtype (also
    PowerSGD before its start iteration), or PowerSGD's three
    (uncompressed tensors batched, all P, all Q): its state counts their
    elements (`compression_stats()`'s "after"; `before`: its value
    before the call)."""
    buf = bucket.buffer()
    ps = state.powersgd
    # no PowerSGD, or its vanilla phase
    if ps is None or ps.compression_stats()[2] == before:
        # fp16 / bf16; None: the bucket's own
        dtype = WIRE_DTYPES.get(state.hook)
        return [(buf.numel(), dtype.itemsize if dtype is not None else buf.element_size())]
    i, e = bucket.index(), buf.element_size()
    p, q = ps.p_memory_dict[i].numel(), ps.q_memory_dict[i].numel()
    return [(ps.compression_stats()[2] - before - p - q, e), (p, e), (q, e)]


def _timed_allreduce_hook(
    state: "DDPSync", bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's hook for sync.compress, timed around: one recorded call
    per bucket, its bytes those of every all-reduce the hook made, in
    the wire dtype, by the library's ring model."""
    buf = bucket.buffer()
    # a world of one has nothing to exchange: hand the bucket straight
    # back
    if state.world_size == 1:
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(buf)
        return fut
    rec = state.comm
    before = state.powersgd.compression_stats()[2] if state.powersgd is not None else 0
    start = rec.begin()
    if state.serial and state.inflight is not None:
        # load-bearing on gloo: collectives in the same order everywhere
        state.inflight.wait()
    fut = state.torch_hook(bucket)
    payload = sent = recv = 0
    for numel, elem in _wire_calls(state, bucket, before):
        s, r, _ = state.traffic("all_reduce", numel, elem)
        payload, sent, recv = payload + numel * elem, sent + s, recv + r

    def done(f: torch.futures.Future) -> torch.Tensor:
        rec.finish(start, "all_reduce", payload, sent, recv)
        return f.value()

    out = fut.then(done)
    if state.serial:
        state.inflight = out
    return out
