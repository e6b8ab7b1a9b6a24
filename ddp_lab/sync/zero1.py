"""sync=zero1: ZeRO stage 1, the ring's two halves with the optimiser
step between them (docs/sync.md, "ZeRO stage 1"; keys and rules:
config/sync.py).

    sync():  gradients -> one flat bucket, / world (before the sum, as DDP: WireFormat),
             reduce-scatter: this rank's chunk of the averaged gradient
    step():  the optimiser steps the chunk of the flat weights this rank owns (its state
             exists for that 1/world only), then all-gather the weights

The module's weights are views of a flat weight bucket (the all-gather
writes them in place) and the optimiser's gradients views of the chunk
the reduce-scatter sums into. Parameters start at multiples of ALIGN
elements, so a piece is cut where a fused optimiser kernel cuts the
whole parameter: DDP's weights bit for bit. On gloo the halves are
ddp_lab's ring (exact bytes); on nccl torch's (bytes modelled).
Checkpoints: _zero1_state.py."""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from ..collectives import all_gather_ring, reduce_scatter_ring
from ..predict import costmodel
from ..world import torch_support
from . import _zero1_state
from ._buckets import WireFormat, make_buckets
from .base import Synchroniser

# elements: a multiple of any CPU vector width and of fused Adam's
# 64-byte task (the cost model pads its predictions on the same grid:
# costmodel.padded)
ALIGN = costmodel.SHARD_ALIGN


class Zero1Sync(Synchroniser):
    name = "zero1"
    bytes_exact = True

    def wrap(self, module: nn.Module) -> nn.Module:
        params = [p for p in module.parameters() if p.requires_grad]
        n, r, cap = self.world_size, self.rank, self.cfg.bucket_mb * 1e6
        # two buffers of one layout, n equal chunks of whole ALIGN
        # units: gradients, weights
        self.grad_buckets = make_buckets(
            params, cap, pad_to=n * ALIGN, align=ALIGN
        )
        self.param_buckets = make_buckets(
            params, cap, pad_to=n * ALIGN, align=ALIGN
        )
        # pack() is the / world before the sum
        self.wire = WireFormat("none", n)
        self.nccl = dist.is_initialized() and dist.get_backend() == "nccl"
        self.bytes_exact = not self.nccl
        # the module's weights become views of the buffer:
        for b in self.param_buckets:
            # the all-gather then writes them, no copy back, and
            b.pack_params()
            # a checkpoint loads straight into it
            for p, o in zip(b.params, b.offsets):
                p.data = b.buffer[o : o + p.numel()].view_as(p)
        # rank r owns chunk r of both: the reduce-scatter sums the
        # gradient's into place
        self.chunks = [b.buffer.chunk(n)[r] for b in self.param_buckets]
        self.chunk_grads = [b.buffer.chunk(n)[r] for b in self.grad_buckets]
        # (bucket, lo, hi): every parameter's part inside this rank's
        # chunk, as a view of the weights (the optimiser updates in
        # place where the all-gather sends from)
        self.pieces: list[tuple[int, int, int]] = []
        for k, b in enumerate(self.param_buckets):
            start, end = r * len(self.chunks[k]), (r + 1) * len(self.chunks[k])
            for p, o in zip(b.params, b.offsets):
                lo, hi = max(start, o), min(end, o + p.numel())
                if lo < hi:
                    self.pieces.append((k, lo, hi))
        self.views = [
            self.param_buckets[k].buffer[lo:hi] for k, lo, hi in self.pieces
        ]
        return module

    def optimizer_params(self) -> list[torch.Tensor]:
        # the optimiser never sees the other ranks' chunks
        return self.views

    def traffic(
        self, op: str, numel: int, elem_size: int
    ) -> tuple[int, int, Optional[int]]:
        """Our ring's bytes (SYNC_COLLECTIVES), or on nccl torch's
        collective's model."""
        if not self.nccl:
            return super().traffic(op, numel, elem_size)
        c = costmodel.cost(op, "torch", numel, self.world_size, elem_size)
        return c.sent[self.rank], c.recv[self.rank], None

    @torch.no_grad()
    def sync(self) -> None:
        for b, grad in zip(self.grad_buckets, self.chunk_grads):
            # each rank's share of the average
            flat = self.wire.pack(b.pack_grads())
            if self.world_size > 1:
                # first half of the ring: sums, scattered
                with self.timed("reduce_scatter", flat, b.nbytes):
                    if self.nccl:
                        torch_support.reduce_scatter_single(grad, flat)
                    else:
                        reduce_scatter_ring(grad, flat)
        for (k, lo, hi), view in zip(self.pieces, self.views):
            base = len(self.chunks[k]) * self.rank
            # (zero_grad dropped it)
            view.grad = self.chunk_grads[k][lo - base : hi - base]
        # the full .grad is now in this rank's chunk of the sum: drop
        # it, as the optimiser's zero_grad would have (it knows only the
        # pieces, not the parameters)
        for b in self.grad_buckets:
            for p in b.params:
                p.grad = None

    @torch.no_grad()
    def step(self, optimizer: torch.optim.Optimizer) -> None:
        # this rank's chunk only: the element-wise update DDP makes
        # there
        optimizer.step()
        for b, chunk in zip(self.param_buckets, self.chunks):
            if self.world_size > 1:
                # second half: every rank's updated chunk, everywhere
                with self.timed("all_gather", b.buffer, b.nbytes):
                    self._all_gather(b.buffer, chunk)

    def _all_gather(self, out: torch.Tensor, chunk: torch.Tensor) -> None:
        if self.nccl:
            torch_support.all_gather_single(out, chunk)
        else:
            all_gather_ring(out, chunk)

    # ---------------------------------------------------------- checkpoints that move
    def optimizer_state(
        self, optimizer: torch.optim.Optimizer
    ) -> Optional[dict]:
        """Collective: the shards gathered into the state a plain
        optimiser over every parameter would hold (rank 0; None
        elsewhere): a checkpoint any world, any sync loads."""
        return _zero1_state.gather(self, optimizer)

    def load_optimizer_state(
        self, optimizer: torch.optim.Optimizer, full: dict
    ) -> None:
        """Any such state (ours, DDP's, from any world): this rank's
        pieces cut out of it."""
        _zero1_state.cut(self, optimizer, full)
