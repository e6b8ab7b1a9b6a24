"""Flat buckets: parameters grouped into contiguous buffers, one collective call per bucket.

Parameters go into buckets in `module.parameters()` order; a bucket is closed when the
next parameter would take it past `cap_bytes` (a parameter larger than the cap gets a
bucket of its own) or has another dtype. `cap_bytes=0` means one bucket per parameter.
Each bucket owns one zero-initialised buffer, padded to a multiple of `pad_to` elements
(ring all-reduce cuts a buffer into world-size equal chunks). The buffers are allocated
once: packing a step's gradients is one `torch.cat` into it, unpacking one copy per
parameter back out. `align=k` starts every parameter at a multiple of k elements (zeros in
between; sync=zero1: a shard then cuts each parameter where a vectorised optimiser kernel
would cut the whole parameter, so its rounding is the same).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Bucket:
    params: list[nn.Parameter]
    offsets: list[int]
    numel: int  # elements that belong to parameters (the rest is padding)
    buffer: torch.Tensor
    dense: bool = True  # parameters end to end from 0 (make_buckets' align=1)

    @property
    def nbytes(self) -> int:
        """Payload: the parameters' bytes, padding excluded."""
        return self.numel * self.buffer.element_size()

    def pack_grads(self) -> torch.Tensor:
        """Copy the parameters' gradients into the buffer; a missing .grad counts as zeros
        (every rank must send the same-sized buffer, used or not)."""
        grads = [p.grad for p in self.params]
        if self.dense and all(g is not None for g in grads):
            torch.cat([g.reshape(-1) for g in grads], out=self.buffer[:self.numel])
        else:
            for p, o, g in zip(self.params, self.offsets, grads):
                view = self.buffer[o:o + p.numel()]
                view.zero_() if g is None else view.copy_(g.reshape(-1))
        return self.buffer

    def unpack_grads(self) -> None:
        for p, o in zip(self.params, self.offsets):
            src = self.buffer[o:o + p.numel()].view_as(p)
            if p.grad is None:
                p.grad = src.clone()
            else:
                p.grad.copy_(src)

    @torch.no_grad()
    def pack_params(self) -> torch.Tensor:
        if not self.dense:
            for p, o in zip(self.params, self.offsets):
                self.buffer[o:o + p.numel()].copy_(p.detach().reshape(-1))
            return self.buffer
        torch.cat([p.detach().reshape(-1) for p in self.params], out=self.buffer[:self.numel])
        return self.buffer

    @torch.no_grad()
    def unpack_params(self) -> None:
        for p, o in zip(self.params, self.offsets):
            p.copy_(self.buffer[o:o + p.numel()].view_as(p))


def make_buckets(params: list[nn.Parameter], cap_bytes: float, pad_to: int = 1,
                 align: int = 1) -> list[Bucket]:
    if cap_bytes < 0:
        raise ValueError(f"bucket size {cap_bytes} bytes: must be >= 0")
    groups: list[list[nn.Parameter]] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if (not groups or cap_bytes == 0 or size + nbytes > cap_bytes
                or p.dtype != groups[-1][0].dtype or p.device != groups[-1][0].device):
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
        buckets.append(Bucket(group, offsets, sum(p.numel() for p in group), buf, align == 1))
    return buckets
