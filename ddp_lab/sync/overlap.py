"""sync.overlap=true for the all-reduce family: each bucket's call starts during backward.

AllReduceSync (allreduce.py) starts its first call once backward is done, so the whole
communication adds to the step. Backward produces the last layer's gradients first, and
those are final long before the first layer's: DDP starts a bucket's all-reduce the moment
its gradients are all ready and lets it run while backward computes the rest.
`OverlappedAllReduce` does the same for allreduce, ring, tree, butterfly and hierarchical:

- `overlapped = True` makes AllReduceSync.wrap fill the buckets in reverse parameter order
  (DDP's: the last layer's bucket is ready first) and one bucket per parameter for
  `sync.bucket_mb=0`;
- `ReadyBuckets` (_overlap.py, DDP's reducer in miniature) counts each bucket's gradients
  from backward's hooks and calls `_launch` when a bucket is complete, in bucket order;
- `_launch` packs the bucket and hands its `_reduce` (the same division, call and timing
  as after backward) to `SerialWorker` (_overlap.py): one background thread, FIFO, so
  every rank runs the same sequence of blocking collectives while backward goes on;
- `sync()` only waits for that thread and unpacks; `no_sync()` (the micro-batches before
  a step's last) holds the hooks back, so gradients only accumulate.

`build_sync` (sync/build.py) picks it for `sync.overlap=true` on more than one rank:
`overlapped(RingSync)` is a class `(OverlappedAllReduce, RingSync)`, ring's algorithm
with these launches. ddp always overlaps (DDP's own reducer), reduce_broadcast starts its
reduces from the same `ReadyBuckets` (reduce_broadcast.py), naive and zero1 refuse it.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch import nn

from ._buckets import Bucket
from ._overlap import ReadyBuckets, SerialWorker
from .allreduce import AllReduceSync


class OverlappedAllReduce(AllReduceSync):
    """AllReduceSync whose buckets are reduced on a background thread during backward."""

    overlapped = True

    def wrap(self, module: nn.Module) -> nn.Module:
        module = super().wrap(module)
        self.worker = SerialWorker(self.device, len(self.buckets), self.name)
        self.ready = ReadyBuckets(self.buckets, self._launch)
        return module

    def _launch(self, i: int, b: Bucket) -> None:
        """Bucket `b`'s gradients are all ready (called from backward's hook)."""
        b.pack_grads()
        self.worker.submit(i, lambda: self._reduce(b.buffer, b.nbytes))

    @torch.no_grad()
    def sync(self) -> None:
        try:
            self.ready.finish()  # every bucket was launched (else: the fix, raised)
        finally:
            self.worker.wait()  # raises a failure of the overlap thread here
        for b in self.buckets:
            b.unpack_grads()

    def no_sync(self):
        return self.ready.disarmed()

    def preflight(self, loss_fn: Callable[..., torch.Tensor]) -> None:
        self.ready.preflight(self.module, loss_fn, self.name)

    def close(self) -> None:
        self.worker.close()  # first: ring's and hierarchical's plans are called from it
        super().close()


@functools.cache
def overlapped(cls: type[AllReduceSync]) -> type[AllReduceSync]:
    """`cls` (AllReduceSync or a subclass) with its buckets launched during backward."""
    if cls is AllReduceSync:
        return OverlappedAllReduce
    return type(f"Overlapped{cls.__name__}", (OverlappedAllReduce, cls),
                {"__module__": cls.__module__, "__doc__": cls.__doc__})
