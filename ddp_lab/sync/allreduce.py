"""sync=allreduce: the gradients in a few flat buckets, one all-reduce
call per bucket.

naive.py makes one call per parameter, and every call pays the
collective's fixed cost, its latency, however small the tensor. Here the
parameters are grouped into buckets of `sync.bucket_mb` MB
(`_buckets.py`; 25 MB holds the MLP's 4 parameters in one) and after
backward, per bucket:

    b.pack_grads()                    # the bucket's .grads, end to end in one flat buffer
    flat /= world_size                # this rank's share (as naive: divided before the sum)
    dist.all_reduce(flat)             # one call: the sum of the shares is the average
    b.unpack_grads()                  # back into each .grad

one latency per bucket instead of one per parameter. `sync.bucket_mb=0`
all-reduces every .grad on its own, in place: naive's calls again, to
compare the two.

Built on this class (each adds one thing, the rest is shared):

- ring, tree, butterfly, hierarchical (ring.py, ...): another
  `all_reduce(flat)`, from `ddp_lab.collectives`, with exact byte
  counts;
- `sync.overlap=true`: overlap.py's `OverlappedAllReduce`, every bucket
  launched during backward (`build_sync` picks it, sync/build.py);
- `sync.compress=fp16|bf16`: the wire format (`WireFormat`,
  `_buckets.py`): `pack` divides and casts the share to 16 bits,
  `unpack` casts the average back; none: `pack` only divides.

Bytes: every rank records what `ddp_lab.predict.costmodel` says its
algorithm moves (`costmodel.SYNC_COLLECTIVES[name]`, through
`Synchroniser.timed`). The library's all-reduce routes data its own way,
invisible from here, so for this sync the model is the ring nccl-tests'
busbw assumes, 2(n-1)/n of the buffer each way (`bytes_exact = False`).
Its config keys and rules: config/sync.py.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ._buckets import Bucket, WireFormat, make_buckets
from .base import Synchroniser


class AllReduceSync(Synchroniser):
    name = "allreduce"
    bytes_exact = False
    # ring: buffers padded to a multiple of the world size
    pad_to_world = False
    # OverlappedAllReduce (overlap.py): buckets launched from backward
    overlapped = False

    def wrap(self, module: nn.Module) -> nn.Module:
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.per_param = self.cfg.bucket_mb == 0 and not (
            self.pad_to_world or self.overlapped
        )
        # overlap: DDP's order
        order = self.params[::-1] if self.overlapped else self.params
        self.buckets: list[Bucket] = (
            []
            if self.per_param
            else make_buckets(
                order,
                self.cfg.bucket_mb * 1e6,
                self.world_size if self.pad_to_world else 1,
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
                self._reduce(p.grad, p.grad.numel() * p.grad.element_size())
            return
        for b in self.buckets:
            b.pack_grads()
            self._reduce(b.buffer, b.nbytes)
            b.unpack_grads()
