"""sync=reduce_broadcast: the course assignment's pattern, on flat
buckets.

    sync():  every rank divides each bucket of gradients by the world size, then
             they are `dist.reduce`d (summed) onto the root rank: only the root
             holds the averaged gradients.
    step():  the root alone takes the optimiser step, then every bucket of parameters is
             `dist.broadcast` from the root: all ranks hold the root's new weights.

The optimiser state lives on the root only; with `sync.root` other than
0, `optimizer_state` ships it to rank 0 for the checkpoint. Twice the
all-reduce's latency count and a root-bound critical path: here to be
measured, not because it is fast. Bytes follow
`ddp_lab.predict.costmodel`'s model (`bytes_exact = False`).
`sync.compress` compresses the gradients' reduce only: 16-bit weights
would be another training method. `sync.overlap=true` starts each
bucket's reduce (async) from backward, stamped like DDP's hook; the
broadcast stays after the root's step (docs/compression_overlap.md).
Keys and rules: config/sync.py."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import nn

from .buckets import Bucket, make_buckets, ReadyBuckets, WireFormat
from .synchroniser import Synchroniser


class ReduceBroadcastSync(Synchroniser):
    name = "reduce_broadcast"
    bytes_exact = False

    def wrap(self, module: nn.Module) -> nn.Module:
        params = [p for p in module.parameters() if p.requires_grad]
        cap = self.cfg.bucket_mb * 1e6
        self.root = self.cfg.root
        self.is_root = self.rank == self.root
        self.overlap = bool(self.cfg.get("overlap", False)) and self.world_size > 1
        # DDP's order
        order = list(reversed(params)) if self.overlap else params
        self.grad_buckets: list[Bucket] = make_buckets(order, cap)
        self.param_buckets: list[Bucket] = make_buckets(params, cap)
        # the gradients' reduce only
        self.wire = WireFormat(self.cfg.compress, self.world_size)
        for b in self.grad_buckets:
            self.wire.add(b.buffer)
        self.ready: Optional[ReadyBuckets] = None
        self.works: list = []
        if self.overlap:
            self.ready = ReadyBuckets(self.grad_buckets, self._launch)
        return module

    def _launch(self, i: int, b: Bucket) -> None:
        """sync.overlap: bucket `b`'s gradients are all ready (called
        from backward)."""
        # the bucket / world, cast to fp16 / bf16 where compressed
        wire = self.wire.pack(b.pack_grads())
        sent, recv, _ = self.traffic("reduce", wire.numel(), wire.element_size())
        # these buckets hold no padding
        payload = wire.numel() * wire.element_size()
        rec = self.comm
        start = rec.begin()
        fut = dist.reduce(wire, dst=self.root, async_op=True).get_future()

        def done(f: torch.futures.Future) -> None:
            # gloo: on its thread as it completes; CUDA: an event
            rec.finish(start, "reduce", payload, sent, recv)
            return None

        self.works.append(fut.then(done))

    def no_sync(self):
        return self.ready.disarmed() if self.ready is not None else nullcontext()

    def preflight(self, loss_fn: Callable[..., torch.Tensor]) -> None:
        if self.ready is not None:
            self.ready.preflight(self.module, loss_fn, self.name)

    @torch.no_grad()
    def sync(self) -> None:
        if self.world_size == 1:
            return
        # the reduces were started during backward
        if self.ready is not None:
            works, self.works = self.works, []
            try:
                self.ready.finish()
            finally:
                for w in works:
                    # a failed reduce raises here (the process group's
                    # timeout)
                    w.wait()
            if self.is_root:
                for b in self.grad_buckets:
                    # the average
                    self.wire.unpack(b.buffer, self.wire.buffer(b.buffer))
                    b.unpack_grads()
            return
        for b in self.grad_buckets:
            buf = b.pack_grads()
            # buf / world, in place (or cast to fp16 / bf16 where
            # compressed)
            wire = self.wire.pack(buf)
            with self.timed("reduce", wire):
                dist.reduce(wire, dst=self.root)
            if self.is_root:
                self.wire.unpack(buf, wire)
                b.unpack_grads()
            # other ranks keep their local gradients: their optimiser
            # never reads them

    @torch.no_grad()
    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.world_size == 1:
            optimizer.step()
            return
        if self.is_root:
            optimizer.step()
        for b in self.param_buckets:
            buf = b.pack_params() if self.is_root else b.buffer
            # parameters: always fp32 (sync.compress is gradients')
            with self.timed("broadcast", buf):
                dist.broadcast(buf, src=self.root)
            if not self.is_root:
                b.unpack_params()

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> Optional[dict]:
        if self.root == 0 or self.world_size == 1:
            return super().optimizer_state(optimizer)
        box: list[Any] = [None]
        if self.is_root:
            dist.send_object_list([optimizer.state_dict()], dst=0)
        elif self.rank == 0:
            dist.recv_object_list(box, src=self.root)
        return box[0] if self.rank == 0 else None
