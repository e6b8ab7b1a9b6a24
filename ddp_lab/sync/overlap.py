"""sync.overlap=true for the all-reduce family (allreduce, ring, tree,
butterfly, hierarchical): each bucket's call starts during backward, as
DDP's do (docs/compression_overlap.md, "Overlap and exposed comm").

`overlapped = True` makes AllReduceSync.wrap fill the buckets in reverse
parameter order (one bucket per parameter for `sync.bucket_mb=0`);
`ReadyBuckets` calls `_launch` as each bucket completes, which packs it
and hands its `_reduce` (the same call and timing as after backward) to
`SerialWorker`; `sync()` waits and unpacks. `overlapped(RingSync)` is a
class `(OverlappedAllReduce, RingSync)`, which `build_sync` picks. ddp
overlaps by itself, reduce_broadcast from the same `ReadyBuckets`; naive
and zero1 refuse it."""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch import nn

from ._buckets import Bucket
from .ready_buckets import ReadyBuckets, SerialWorker
from .allreduce import AllReduceSync


class OverlappedAllReduce(AllReduceSync):
    """AllReduceSync whose buckets are reduced on a background thread
    during backward."""

    overlapped = True

    def wrap(self, module: nn.Module) -> nn.Module:
        module = super().wrap(module)
        self.worker = SerialWorker(self.device, len(self.buckets), self.name)
        self.ready = ReadyBuckets(self.buckets, self._launch)
        return module

    def _launch(self, i: int, b: Bucket) -> None:
        """Bucket `b`'s gradients are all ready (called from backward's
        hook)."""
        b.pack_grads()
        self.worker.submit(i, lambda: self._reduce(b.buffer, b.nbytes))

    @torch.no_grad()
    def sync(self) -> None:
        try:
            # every bucket was launched (else: the fix, raised)
            self.ready.finish()
        finally:
            # raises a failure of the overlap thread here
            self.worker.wait()
        for b in self.buckets:
            b.unpack_grads()

    def no_sync(self):
        return self.ready.disarmed()

    def preflight(self, loss_fn: Callable[..., torch.Tensor]) -> None:
        self.ready.preflight(self.module, loss_fn, self.name)

    def close(self) -> None:
        # first: ring's and hierarchical's plans are called from it
        self.worker.close()
        super().close()


@functools.cache
def overlapped(cls: type[AllReduceSync]) -> type[AllReduceSync]:
    """`cls` (AllReduceSync or a subclass) with its buckets launched
    during backward."""
    if cls is AllReduceSync:
        return OverlappedAllReduce
    return type(
        f"Overlapped{cls.__name__}",
        (OverlappedAllReduce, cls),
        {"__module__": cls.__module__, "__doc__": cls.__doc__},
    )
