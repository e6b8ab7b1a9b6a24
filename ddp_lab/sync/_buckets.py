"""The flat buffers a synchroniser sends: parameters grouped into
contiguous buckets, one collective call per bucket (`make_buckets`), and
the dtype they travel in (`WireFormat`).

Parameters go into buckets in `module.parameters()` order; a bucket is
closed when the next parameter would take it past `cap_bytes` (a
parameter larger than the cap gets a bucket of its own) or has another
dtype. `cap_bytes=0` means one bucket per parameter. Each bucket owns
one zero-initialised buffer, padded to a multiple of `pad_to` elements
(ring all-reduce cuts a buffer into world-size equal chunks). The
buffers are allocated once: packing a step's gradients is one
`torch.cat` into it, unpacking one copy per parameter back out.
`align=k` starts every parameter at a multiple of k elements (zeros in
between; sync=zero1: a shard then cuts each parameter where a vectorised
optimiser kernel would cut the whole parameter, so its rounding is the
same).

`WireFormat` is sync.compress for our synchronisers, in one place. In
every mode each bucket is divided by the world size first, as DDP and
torch's fp16/bf16 hooks do: the sum of the shares is then the average,
rounded as DDP's is, and in fp16 the sum of n divided values cannot
overflow where the sum of n raw ones might.

`sync.compress=none`: the divided bucket is reduced as it is.
`sync.compress=fp16|bf16`: the divided bucket is cast into a wire buffer
allocated once per bucket (the same length as the fp32 bucket, padding
included, so the ring's equal chunks stay equal), reduced in that dtype
by the synchroniser's own algorithm, and cast back into the fp32 bucket.
Half the bytes on the wire; the sums are rounded to 16 bits at every
step of the algorithm (gloo's all_reduce and reduce add fp16 and bf16 on
CPU: tests/test_compress.py checks it on real process groups, so no
combination is refused for it). `powersgd` is torch's DDP comm hook: ddp
only (config/sync.py's BucketSyncConfig.check).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn


@dataclass
class Bucket:
    params: list[nn.Parameter]
    offsets: list[int]
    # elements that belong to parameters (the rest is padding)
    numel: int
    buffer: torch.Tensor
    # parameters end to end from 0 (make_buckets' align=1)
    dense: bool = True

    @property
    def nbytes(self) -> int:
        """Payload: the parameters' bytes, padding excluded."""
        return self.numel * self.buffer.element_size()

    def pack_grads(self) -> torch.Tensor:
        """Copy the parameters' gradients into the buffer; a missing
        .grad counts as zeros (every rank must send the same-sized
        buffer, used or not)."""
        grads = [p.grad for p in self.params]
        if self.dense and all(g is not None for g in grads):
            torch.cat(
                [g.reshape(-1) for g in grads], out=self.buffer[: self.numel]
            )
        else:
            for p, o, g in zip(self.params, self.offsets, grads):
                view = self.buffer[o : o + p.numel()]
                view.zero_() if g is None else view.copy_(g.reshape(-1))
        return self.buffer

    def unpack_grads(self) -> None:
        for p, o in zip(self.params, self.offsets):
            src = self.buffer[o : o + p.numel()].view_as(p)
            if p.grad is None:
                p.grad = src.clone()
            else:
                p.grad.copy_(src)

    @torch.no_grad()
    def pack_params(self) -> torch.Tensor:
        if not self.dense:
            for p, o in zip(self.params, self.offsets):
                self.buffer[o : o + p.numel()].copy_(p.detach().reshape(-1))
            return self.buffer
        torch.cat(
            [p.detach().reshape(-1) for p in self.params],
            out=self.buffer[: self.numel],
        )
        return self.buffer

    @torch.no_grad()
    def unpack_params(self) -> None:
        for p, o in zip(self.params, self.offsets):
            p.copy_(self.buffer[o : o + p.numel()].view_as(p))


def make_buckets(
    params: list[nn.Parameter],
    cap_bytes: float,
    pad_to: int = 1,
    align: int = 1,
) -> list[Bucket]:
    if cap_bytes < 0:
        raise ValueError(f"bucket size {cap_bytes} bytes: must be >= 0")
    groups: list[list[nn.Parameter]] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if (
            not groups
            or cap_bytes == 0
            or size + nbytes > cap_bytes
            or p.dtype != groups[-1][0].dtype
            or p.device != groups[-1][0].device
        ):
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += nbytes
    buckets = []
    for group in groups:
        offsets, n = [], 0
        for p in group:
            n = -(-n // align) * align
            offsets.append(n)
            n += p.numel()
        padded = -(-n // pad_to) * pad_to
        buf = torch.zeros(padded, dtype=group[0].dtype, device=group[0].device)
        buckets.append(
            Bucket(
                group, offsets, sum(p.numel() for p in group), buf, align == 1
            )
        )
    return buckets


#: sync.compress -> the dtype on the wire (None: the gradients' own)
WIRE_DTYPES: dict[str, Optional[torch.dtype]] = {
    "none": None,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


class WireFormat:
    """The dtype one synchroniser's gradients travel in (sync.compress),
    with the division by the world size before the sum and the buffers
    it needs (see the module docstring)."""

    def __init__(self, mode: str, world_size: int):
        self.mode = mode
        self.dtype = WIRE_DTYPES[mode]
        self.world_size = world_size
        self._buffers: dict[int, torch.Tensor] = {}

    def add(self, flat: torch.Tensor) -> None:
        """Allocate `flat`'s wire buffer now (a bucket buffer, which
        never moves)."""
        if self.dtype is not None:
            self._buffers[flat.data_ptr()] = torch.zeros(
                flat.numel(), dtype=self.dtype, device=flat.device
            )

    def buffer(self, flat: torch.Tensor) -> torch.Tensor:
        """The tensor that goes on the wire for `flat`: `flat` itself
        when uncompressed, its preallocated buffer for a bucket, a new
        one for anything else (a per-parameter .grad, which
        zero_grad(set_to_none) replaces every step)."""
        if self.dtype is None:
            return flat
        wire = self._buffers.get(flat.data_ptr())
        if wire is None or wire.numel() != flat.numel():
            wire = torch.empty(
                flat.numel(), dtype=self.dtype, device=flat.device
            )
        return wire

    def pack(self, flat: torch.Tensor) -> torch.Tensor:
        """The tensor to reduce: `flat / world`, itself (none) or cast
        to the wire. Divided before the sum, as DDP does: then the sum
        of the shares is the average, and it rounds as DDP's does
        (divided after, a 3-rank run drifts from DDP in the last bits,
        and Adam grows them: docs/sync.md); in fp16 the sum then cannot
        overflow either."""
        flat.div_(self.world_size)
        wire = self.buffer(flat)
        if wire is not flat:
            wire.copy_(flat.view(-1))
        return wire

    def unpack(self, flat: torch.Tensor, wire: torch.Tensor) -> None:
        """`flat` := the average, from the reduced `wire` (cast back
        where it was cast)."""
        if wire is not flat:
            flat.view(-1).copy_(wire)

    def nbytes(self, nbytes: int, flat: torch.Tensor) -> int:
        """`nbytes` of `flat`'s dtype, as bytes on the wire."""
        return (
            nbytes
            if self.dtype is None
            else nbytes // flat.element_size() * self.dtype.itemsize
        )
