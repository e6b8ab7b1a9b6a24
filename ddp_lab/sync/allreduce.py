"""sync=allreduce: flattened gradient buckets, each `torch.distributed.all_reduce`d, averaged.

After backward, each bucket's gradients are copied into one flat buffer, summed across
ranks with one all-reduce call, divided by the world size and copied back into .grad.
`sync.bucket_mb` sets the bucket size; `sync.bucket_mb=0` all-reduces every parameter's
.grad on its own (no copies, one call per parameter): compare the two to see what
bucketing buys (per-call latency paid once per bucket instead of once per tensor).

ring, tree and butterfly (ring.py, tree.py, butterfly.py) are this synchroniser with
another all-reduce algorithm from `ddp_lab.collectives` and exact byte accounting.

Bytes: every rank records what `ddp_lab.measure.costmodel` says its algorithm moves
(`costmodel.SYNC_COLLECTIVES[name]`, through `Synchroniser.timed`). The library's all-reduce routes data its own way,
invisible from here, so for this sync the model is the ring nccl-tests' busbw assumes,
2(n-1)/n of the buffer each way (`bytes_exact = False`).

`sync.compress=fp16|bf16` (every bucketed synchroniser, since all go through `_reduce`):
the bucket is averaged, cast to 16 bits into a preallocated wire buffer, reduced in that
dtype and cast back (`ddp_lab/sync/_wire.py`); bytes are counted in the wire dtype.

`sync.overlap=true` (sync/_overlap.py): the buckets hold the parameters in reverse order
and each is packed and handed to `_reduce` the moment its gradients are ready, during
backward, on one background thread (`SerialWorker`; every algorithm here is a blocking
call, the library's all-reduce included, and `_reduce` stays the one per-bucket entry);
`sync()` waits for the thread and unpacks. `sync.bucket_mb=0` then means one bucket per
parameter.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import nn

from ._buckets import Bucket, make_buckets
from ._wire import WireFormat
from ._overlap import ReadyBuckets, SerialWorker
from .base import Synchroniser


class AllReduceSync(Synchroniser):
    name = "allreduce"
    bytes_exact = False
    pad_to_world = False  # ring: buffers padded to a multiple of the world size

    def wrap(self, module: nn.Module) -> nn.Module:
        params = [p for p in module.parameters() if p.requires_grad]
        self.overlap = bool(self.cfg.get("overlap", False)) and self.world_size > 1
        self.per_param = self.cfg.bucket_mb == 0 and not self.pad_to_world and not self.overlap
        order = list(reversed(params)) if self.overlap else params  # DDP's order
        self.buckets: list[Bucket] = [] if self.per_param else make_buckets(
            order, self.cfg.bucket_mb * 1e6, self.world_size if self.pad_to_world else 1)
        self.params = params
        self.wire = WireFormat(self.cfg.compress, self.world_size)  # sync.compress (_wire.py)
        for b in self.buckets:
            self.wire.add(b.buffer)
        self.ready: Optional[ReadyBuckets] = None
        if self.overlap:
            self.worker = SerialWorker(self.device, len(self.buckets), self.name)
            self.ready = ReadyBuckets(self.buckets, self._launch)
        return module

    def _launch(self, i: int, b: Bucket) -> None:
        """sync.overlap: bucket `b`'s gradients are all ready (called from backward)."""
        b.pack_grads()
        self.worker.submit(i, lambda: self._reduce(b.buffer, b.nbytes))

    def no_sync(self):
        return self.ready.disarmed() if self.ready is not None else nullcontext()

    def preflight(self, loss_fn: Callable[..., torch.Tensor]) -> None:
        if self.ready is not None:
            self.ready.preflight(self.module, loss_fn, self.name)

    def close(self) -> None:
        if self.ready is not None:
            self.worker.close()

    # the algorithm: subclasses replace this (and add their entry to
    # costmodel.SYNC_COLLECTIVES, or override `traffic`)
    def all_reduce(self, flat: torch.Tensor) -> None:
        """Sum `flat` across ranks, in place."""
        dist.all_reduce(flat)

    def _reduce(self, flat: torch.Tensor, payload: int) -> None:
        """The one per-bucket entry: `flat` (`payload` bytes of gradients) becomes the
        average over ranks."""
        wire = self.wire.pack(flat)  # flat / world: itself, or in fp16 / bf16
        with self.timed("all_reduce", wire, self.wire.nbytes(payload, flat)):
            self.all_reduce(wire)
        self.wire.unpack(flat, wire)  # the average, in flat's dtype

    @torch.no_grad()
    def sync(self) -> None:
        if self.world_size == 1:
            return
        if self.ready is not None:  # the buckets were launched during backward
            try:
                self.ready.finish()
            finally:
                self.worker.wait()  # raises a failure of the overlap thread here
            for b in self.buckets:
                b.unpack_grads()
            return
        if self.per_param:
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)  # a rank that did not use p still takes part
                self._reduce(p.grad, p.grad.numel() * p.grad.element_size())
            return
        for b in self.buckets:
            b.pack_grads()
            self._reduce(b.buffer, b.nbytes)
            b.unpack_grads()
