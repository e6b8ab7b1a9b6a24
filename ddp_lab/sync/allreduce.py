"""sync=allreduce: the gradients in a few flat buckets, one all-reduce
call per bucket.

naive.py makes one call per parameter, and every call pays the
collective's fixed cost, its latency, however small the tensor. Here the
parameters are grouped into buckets of `sync.bucket_mb` MB
(`buckets.py`; 25 MB holds the MLP's 4 parameters in one) and after
backward, per bucket:

    b.pack_grads()                    # the bucket's .grads, end to end in one flat buffer
    flat /= world_size                # this rank's share (as naive: divided before the sum)
    dist.all_reduce(flat)             # one call: the sum of the shares is the average
    b.unpack_grads()                  # back into each .grad

one latency per bucket instead of one per parameter. `sync.bucket_mb=0`
all-reduces every .grad on its own, in place: naive's calls again, to
compare the two.

Built on this class (each adds one thing, the rest is shared):

- tree and butterfly (below), ring and hierarchical (ring.py,
  hierarchical.py): another
  `all_reduce(flat)`, from `ddp_lab.collectives`, with exact byte
  counts;
- `sync.overlap=true`: `OverlappedAllReduce` (below), every bucket
  launched during backward (`build_sync` picks it, sync/build.py);
- `sync.compress=fp16|bf16`: the wire format (`WireFormat`,
  `buckets.py`): `pack` divides and casts the share to 16 bits,
  `unpack` casts the average back; none: `pack` only divides.

Bytes: every rank records what `ddp_lab.predict.costmodel` says its
algorithm moves (`costmodel.SYNC_COLLECTIVES[name]`, through
`Synchroniser.timed`). The library's all-reduce routes data its own way,
invisible from here, so for this sync the model is the ring nccl-tests'
busbw assumes, 2(n-1)/n of the buffer each way (`bytes_exact = False`).
Its config keys and rules: config/sync.py.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from ..collectives import all_reduce_butterfly, all_reduce_tree
from .synchroniser import Synchroniser
from .buckets import Bucket, make_buckets, ReadyBuckets, SerialWorker, WireFormat


class AllReduceSync(Synchroniser):
    name = "allreduce"
    bytes_exact = False
    # ring: buffers padded to a multiple of the world size
    pad_to_world = False
    # OverlappedAllReduce (below): buckets launched from backward
    overlapped = False

    def wrap(self, module: nn.Module) -> nn.Module:
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.per_param = self.cfg.bucket_mb == 0 and not (self.pad_to_world or self.overlapped)
        # overlap: DDP's order
        order = self.params[::-1] if self.overlapped else self.params
        self.buckets: list[Bucket] = (
            []
            if self.per_param
            else make_buckets(
                order, self.cfg.bucket_mb * 1e6, self.world_size if self.pad_to_world else 1
            )
        )
        # sync.compress
        self.wire = WireFormat(self.cfg.compress, self.world_size)
        for b in self.buckets:
            self.wire.add(b.buffer)
        return module

    def all_reduce(self, flat: torch.Tensor) -> None:
        """Sum `flat` across ranks, in place: the algorithm, which ring,
        tree, butterfly and hierarchical replace (each with its entry in
        costmodel.SYNC_COLLECTIVES)."""
        dist.all_reduce(flat)

    def _reduce(self, flat: torch.Tensor, payload: int) -> None:
        """`flat` (`payload` bytes of gradients) := its average over
        ranks; one call."""
        # flat / world: flat itself, or cast to fp16 / bf16
        wire = self.wire.pack(flat)
        with self.timed("all_reduce", wire, self.wire.nbytes(payload, flat)):
            # the sum of the shares: the average
            self.all_reduce(wire)
        # into flat (cast back where it was cast)
        self.wire.unpack(flat, wire)

    @torch.no_grad()
    def sync(self) -> None:
        if self.world_size == 1:
            return
        # sync.bucket_mb=0: naive's calls, each .grad in place
        if self.per_param:
            for p in self.params:
                if p.grad is None:
                    # a rank that did not use p still takes part
                    p.grad = torch.zeros_like(p)
                self._reduce(p.grad, p.grad.nbytes)
            return
        for b in self.buckets:
            b.pack_grads()
            self._reduce(b.buffer, b.nbytes)
            b.unpack_grads()


class TreeSync(AllReduceSync):
    """sync=tree: binomial-tree reduce to rank 0, then binomial-tree
    broadcast, on flat buckets.

    `ddp_lab.collectives.all_reduce_tree`. Rank v's parent is v minus its
    lowest set bit and its children are v + 2^k for every 2^k below that
    bit (rank 0: every 2^k < n), so the reduce and the broadcast each take
    ceil(log2 n) rounds. A rank sends and receives the whole buffer once
    per tree edge it has: once to/from its parent, once per child. That is
    log2(n) times the ring's traffic at the root, for log2(n) instead of
    2(n-1) latencies: the tree wins on small buffers and many ranks, the
    ring on large buffers."""

    name = "tree"
    bytes_exact = True

    def all_reduce(self, flat: torch.Tensor) -> None:
        all_reduce_tree(flat)


class ButterflySync(AllReduceSync):
    """sync=butterfly: recursive-doubling all-reduce, any world size, on
    flat buckets.

    `ddp_lab.collectives.all_reduce_butterfly`. With p the largest power
    of two <= n, ranks p..n-1 first fold their buffer into ranks
    0..n-p-1; ranks 0..p-1 then exchange the whole buffer with partner
    rank XOR 2^k for k = 0..log2(p)-1, adding what they receive (a+b ==
    b+a bitwise, so partners stay identical); the folded ranks get the
    result back. log2(p) (+2 when n is not a power of two) latencies,
    log2(p) whole buffers each way per rank."""

    name = "butterfly"
    bytes_exact = True

    def all_reduce(self, flat: torch.Tensor) -> None:
        all_reduce_butterfly(flat)


# sync.overlap=true for the all-reduce family (allreduce, ring, tree,
# butterfly, hierarchical): each bucket's call starts during backward, as
# DDP's do (docs/compression_overlap.md, "Overlap and exposed comm").


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
