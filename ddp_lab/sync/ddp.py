"""sync=ddp: torch's DistributedDataParallel, its bucket all-reduces timed by a comm hook.

DDP launches each gradient bucket's all-reduce from inside backward, as soon as the
bucket is ready, so communication overlaps the rest of backward. The comm hook below is
DDP's default one (divide by the world size, all-reduce, return the future) plus
accounting, so that overlap stays real:

- the start is stamped when DDP hands the hook a ready bucket, the end in the future's
  completion callback. CPU: host clock; the callback runs on gloo's worker thread the
  moment the all-reduce completes. CUDA: events; the hook runs on the stream that
  produced the bucket and NCCL's completion callbacks run with the current stream synced
  to the collective's, so the end event fires when the all-reduce is done. The events are
  read once per epoch by `take_comm()` (one synchronize), never per step.
- bucket all-reduces may be in flight together: comm time is the union of the
  intervals, and it overlaps backward (see `ddp_lab.timing` on comm_fraction).

`sync.sync()` is a no-op here (DDP has finished by the time backward returns). A world of
one runs the bare model: nothing to exchange, and DDP's reducer would cost a third of the step.
"""

# no `from __future__ import annotations`: DDP checks the hook's annotations at runtime

from contextlib import nullcontext
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .. import costmodel
from .base import Synchroniser, unused_parameters


class DDPSync(Synchroniser):
    name = "ddp"
    bytes_exact = False  # the backend's own all-reduce; bytes follow the ring model

    @classmethod
    def check(cls, cfg: Any, world_size: int) -> None:
        if not cfg.get("overlap", True):
            raise ValueError("sync=ddp sync.overlap=false: DDP always overlaps its bucket "
                             "all-reduces with backward; drop sync.overlap=false (or use "
                             "sync=allreduce sync.overlap=false for the same buckets after "
                             "backward)")
        if cfg.static_graph and cfg.find_unused_parameters:
            raise ValueError("sync.static_graph=true and sync.find_unused_parameters=true "
                             "contradict each other: set one of them to false")
        if cfg.bucket_cap_mb < 0:  # DDP itself would take it silently
            raise ValueError(f"sync.bucket_cap_mb={cfg.bucket_cap_mb}: must be >= 0 "
                             "(0 = one bucket per parameter)")

    def wrap(self, module: nn.Module) -> nn.Module:
        """DDP around the model; in a world of one the model itself. One rank has nothing to
        all-reduce (the hook below hands the bucket straight back), yet DDP's reducer still
        copies every gradient into its buckets and back and runs its autograd hooks: 35% of
        a 1-rank step here (docs/performance.md). Copies do not change a bit: the weights
        are identical with and without it (tests/test_fast.py)."""
        if self.world_size == 1:
            return module
        cfg = self.cfg
        ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DDP(module, device_ids=ids, bucket_cap_mb=cfg.bucket_cap_mb,
                  gradient_as_bucket_view=cfg.gradient_as_bucket_view,
                  static_graph=cfg.static_graph,
                  find_unused_parameters=cfg.find_unused_parameters)
        ddp.register_comm_hook(self, _timed_allreduce_hook)
        return ddp

    def no_sync(self):
        """DDP all-reduces from inside backward: `DDP.no_sync()` keeps the gradients local
        (forward and backward must both run inside it); the next backward outside it
        all-reduces the accumulated sum. In a world of one (the bare model) there is
        nothing to hold back. train.compile wraps the model: DDP is the wrapped one."""
        ddp = getattr(self.model, "_orig_mod", self.model)
        return ddp.no_sync() if isinstance(ddp, DDP) else nullcontext()

    def preflight(self, loss_fn: Callable[[], torch.Tensor]) -> None:
        """DDP without unused-parameter detection waits forever for a gradient that never
        comes, and only says so at the next iteration: find out before the first step."""
        if not (self.cfg.find_unused_parameters or self.cfg.static_graph):
            # (otherwise DDP handles parameters without gradients itself)
            unused = unused_parameters(self.module, loss_fn)
            if unused:
                names = ", ".join(unused[:5]) + (" ..." if len(unused) > 5 else "")
                raise ValueError(f"sync=ddp: the model has parameters that get no gradient "
                                 f"({names}): set sync.find_unused_parameters=true (or "
                                 "sync.static_graph=true if the set never changes)")
        # One forward and backward through DDP, gradients dropped, weights untouched: DDP
        # lays its buckets out anew after its first iteration, so without this a run
        # resumed from a checkpoint would sum its first gradients in another order than the
        # run it continues (on 3+ ranks the rounding differs: no bit-identical resume).
        # Every rank runs it (one all-reduce per bucket); its comm is no epoch's.
        loss_fn(self.model).backward()
        self.module.zero_grad(set_to_none=True)
        self.take_comm()


def _timed_allreduce_hook(state: "DDPSync", bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default hook (divide by world size, then all-reduce), plus accounting."""
    buf = bucket.buffer()
    n = state.world_size
    if n == 1:  # a world of one has nothing to exchange: hand the bucket straight back
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(buf)
        return fut
    nbytes = buf.numel() * buf.element_size()
    (op, algorithm), = costmodel.SYNC_PHASES["ddp"]
    c = costmodel.cost(op, algorithm, buf.numel(), n, buf.element_size())
    sent, recv = c.sent[state.rank], c.recv[state.rank]
    rec = state.comm
    buf.div_(n)
    start = rec.begin()
    fut = dist.all_reduce(buf, async_op=True).get_future()

    def done(f: torch.futures.Future) -> torch.Tensor:
        rec.finish(start, op, nbytes, sent, recv)
        return f.value()[0]

    return fut.then(done)
