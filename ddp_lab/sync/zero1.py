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
whole parameter: given the same sum, the sharded step is the fused step
over whole parameters bit for bit (tests/test_zero1.py: the CNN at 3 and
5 ranks, fused Adam and SGD with momentum). At 2 ranks that is DDP's
weights bit for bit. At 3 and more the ring sums in another order than
DDP, as every synchroniser does, and on the CNN a max-pool can turn that
last bit into a gradient a few percent apart: zero1 then ends as far from
DDP as any of them may (docs/sync.md, "Why 3 ranks drift from DDP").
On gloo the halves are ddp_lab's ring (exact bytes); on nccl torch's
(bytes modelled).
Checkpoints: `gather_state` and `cut_state`, below."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn

from ..collectives import all_gather_ring, reduce_scatter_ring
from ..predict import costmodel
from ..world import torch_support
from .synchroniser import Synchroniser
from .buckets import make_buckets, WireFormat

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
        self.grad_buckets = make_buckets(params, cap, pad_to=n * ALIGN, align=ALIGN)
        self.param_buckets = make_buckets(params, cap, pad_to=n * ALIGN, align=ALIGN)
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
        self.views = [self.param_buckets[k].buffer[lo:hi] for k, lo, hi in self.pieces]
        return module

    def optimizer_params(self) -> list[torch.Tensor]:
        # the optimiser never sees the other ranks' chunks
        return self.views

    def traffic(self, op: str, numel: int, elem_size: int) -> tuple[int, int, Optional[int]]:
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
    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> Optional[dict]:
        """Collective: the shards gathered into the state a plain
        optimiser over every parameter would hold (rank 0; None
        elsewhere): a checkpoint any world, any sync loads."""
        return gather_state(self, optimizer)

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, full: dict) -> None:
        """Any such state (ours, DDP's, from any world): this rank's
        pieces cut out of it."""
        cut_state(self, optimizer, full)


# sync=zero1's checkpoints: the optimiser state's shards gathered into
# the state a plain optimiser over every parameter would hold, and cut
# into shards again, so a checkpoint resumes on any world size and under
# any synchroniser (docs/sync.md, "ZeRO stage 1"). A parameter's state is
# per element (moments, momentum) or a scalar (Adam's step).


def gather_state(z: Any, optimizer: torch.optim.Optimizer) -> Optional[dict]:
    """Collective: the state a plain optimiser over
    `module.parameters()` would hold."""
    index = {id(p): i for i, p in enumerate(z.module.parameters())}
    mine = optimizer.state_dict()
    # which keys are per element (moments, momentum) and the scalars
    # (Adam's step, the same on every piece): from any rank that holds a
    # piece with state
    held = [s for s in mine["state"].values() if s]
    kinds = {
        key: (torch.is_tensor(v) and v.dim() == 1, v)
        for key, v in (held[0] if held else {}).items()
    }
    if z.world_size > 1:
        every: list = [None] * z.world_size
        dist.all_gather_object(every, kinds)
        kinds = next((d for d in every if d), {})
    state: dict[int, dict] = {}
    for k, b in enumerate(z.param_buckets):
        for key, (per_element, scalar) in kinds.items():
            whole = None
            # this rank's chunk of it, then every chunk end to end
            if per_element:
                chunk = torch.zeros_like(z.chunks[k])
                base = len(chunk) * z.rank
                for j, (kk, lo, hi) in enumerate(z.pieces):
                    if kk == k and key in mine["state"].get(j, {}):
                        chunk[lo - base : hi - base] = mine["state"][j][key]
                whole = chunk.clone()
                if z.world_size > 1:
                    whole = torch.empty_like(b.buffer)
                    z._all_gather(whole, chunk)
            for p, o in zip(b.params, b.offsets):
                state.setdefault(index[id(p)], {})[key] = (
                    _own(scalar) if whole is None else whole[o : o + p.numel()].view_as(p).clone()
                )
    group = {**mine["param_groups"][0], "params": list(index.values())}
    return {"state": state, "param_groups": [group]} if z.rank == 0 else None


def cut_state(z: Any, optimizer: torch.optim.Optimizer, full: dict) -> None:
    """Load a whole-model state (ours, DDP's, any sync's, any world's)
    into `z`'s pieces."""
    index = {id(p): i for i, p in enumerate(z.module.parameters())}
    # (bucket, key): laid out as it
    flats: dict[tuple[int, str], torch.Tensor] = {}
    # Adam's step: the same for every parameter
    scalars: dict = {}
    for k, b in enumerate(z.param_buckets):
        for p, o in zip(b.params, b.offsets):
            for key, v in full["state"].get(index[id(p)], {}).items():
                if not (torch.is_tensor(v) and v.dim() > 0):
                    scalars[key] = v
                    continue
                if (k, key) not in flats:
                    flats[k, key] = torch.zeros_like(b.buffer)
                flats[k, key][o : o + p.numel()] = v.reshape(-1)
    state = {}
    # a piece: elements lo..hi of bucket k
    for j, (k, lo, hi) in enumerate(z.pieces):
        state[j] = {key: _own(v) for key, v in scalars.items()}
        state[j].update({key: f[lo:hi].clone() for (kk, key), f in flats.items() if kk == k})
    group = {**full["param_groups"][0], "params": list(range(len(z.pieces)))}
    optimizer.load_state_dict(
        {"state": {j: s for j, s in state.items() if s}, "param_groups": [group]}
    )


def _own(v):
    """A copy of a scalar for each parameter: Adam adds 1 to its step in
    place, and a step tensor shared by every parameter would count once
    per parameter."""
    return v.clone() if torch.is_tensor(v) else v
