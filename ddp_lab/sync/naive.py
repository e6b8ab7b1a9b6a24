"""sync=naive: the first synchroniser of the course, one all-reduce per
parameter.

After backward every rank holds the gradients of its own slice of the
batch. To step like one process on the whole batch, each .grad must
become the average over ranks: `torch.distributed.all_reduce` sums a
tensor across ranks in place, so each rank first divides its own by the
world size and the sum is the mean. (Dividing the sum afterwards gives
the same mean in exact arithmetic; in floating point the two round
differently, and DDP divides first: docs/sync.md, "Why 3 ranks drift".)
Do that for every parameter, one after the other: that is all data
parallelism needs to be correct.

Why it is only the first step: it makes one call per parameter (the
MLP's 4, a ResNet's hundreds), and every call pays the collective's
fixed cost, its latency, however small the tensor. Nothing overlaps
backward either: all the calls start once backward is done.
sync=allreduce fixes the first with buckets (one call for many
parameters; with sync.bucket_mb=0 it runs these same calls),
sync.overlap the second, and DDP both.

Bytes: as sync=allreduce's, the library all-reduce modelled as a ring
(`costmodel.SYNC_COLLECTIVES["naive"]`; not exact, we cannot see the
library's routing).

Its rules (overlap and compression refused, each with the sync that runs
it): config/sync.py.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .synchroniser import Synchroniser


class NaiveSync(Synchroniser):
    name = "naive"
    bytes_exact = False

    @torch.no_grad()
    def sync(self) -> None:
        if self.world_size == 1:
            return
        for p in self.module.parameters():
            if not p.requires_grad:
                continue
            if p.grad is None:
                # a rank that did not use p still takes part
                p.grad = torch.zeros_like(p)
            # each rank's share: their sum is the average (as DDP)
            p.grad /= self.world_size
            # counted and timed (synchroniser.py)
            with self.timed("all_reduce", p.grad):
                # the sum over ranks, in place
                dist.all_reduce(p.grad)
