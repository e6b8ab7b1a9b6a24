"""sync.compress for our synchronisers: the dtype gradients travel in, in one place.

`sync.compress=fp16|bf16`: each bucket is divided by the world size first (as torch's
fp16/bf16 DDP hooks do: the sum of n averaged values cannot overflow fp16 where the sum of
n raw ones might), cast into a wire buffer allocated once per bucket (the same length as
the fp32 bucket, padding included, so the ring's equal chunks stay equal), reduced in that
dtype by the synchroniser's own algorithm, and cast back into the fp32 bucket. Half the
bytes on the wire; the sums themselves are rounded to 16 bits at every step of the
algorithm (gloo's all_reduce / reduce add fp16 and bf16 on CPU in torch 2.14: checked by
tests/test_compress.py on real process groups, so no combination is refused for it).

`sync.compress=none`: the bucket is reduced as it is and averaged afterwards, bit for bit
as before compression existed. `powersgd` is torch's DDP comm hook: ddp only
(config/sync/allreduce.py's BucketSyncConfig.check).
"""

from __future__ import annotations

from typing import Optional

import torch

#: sync.compress -> the dtype on the wire (None: the gradients' own)
WIRE_DTYPES: dict[str, Optional[torch.dtype]] = {
    "none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


class WireFormat:
    """The dtype one synchroniser's gradients travel in (sync.compress), with the division
    by the world size before the sum and the buffers it needs (see the module docstring)."""

    def __init__(self, mode: str, world_size: int):
        self.mode = mode
        self.dtype = WIRE_DTYPES[mode]
        self.world_size = world_size
        self._buffers: dict[int, torch.Tensor] = {}

    def add(self, flat: torch.Tensor) -> None:
        """Allocate `flat`'s wire buffer now (a bucket buffer, which never moves)."""
        if self.dtype is not None:
            self._buffers[flat.data_ptr()] = torch.zeros(flat.numel(), dtype=self.dtype,
                                                         device=flat.device)

    def buffer(self, flat: torch.Tensor) -> torch.Tensor:
        """The tensor that goes on the wire for `flat`: `flat` itself when uncompressed, its
        preallocated buffer for a bucket, a new one for anything else (a per-parameter
        .grad, which zero_grad(set_to_none) replaces every step)."""
        if self.dtype is None:
            return flat
        wire = self._buffers.get(flat.data_ptr())
        if wire is None or wire.numel() != flat.numel():
            wire = torch.empty(flat.numel(), dtype=self.dtype, device=flat.device)
        return wire

    def pack(self, flat: torch.Tensor) -> torch.Tensor:
        """The tensor to reduce: `flat / world`, itself (none) or cast to the wire. Divided
        before the sum, as DDP does: then the sum of the shares is the average, and it
        rounds as DDP's does (divided after, a 3-rank run drifts from DDP in the last bits,
        and Adam grows them: docs/sync.md); in fp16 the sum then cannot overflow either."""
        flat.div_(self.world_size)
        wire = self.buffer(flat)
        if wire is not flat:
            wire.copy_(flat.view(-1))
        return wire

    def unpack(self, flat: torch.Tensor, wire: torch.Tensor) -> None:
        """`flat` := the average, from the reduced `wire` (cast back where it was cast)."""
        if wire is not flat:
            flat.view(-1).copy_(wire)

    def nbytes(self, nbytes: int, flat: torch.Tensor) -> int:
        """`nbytes` of `flat`'s dtype, as bytes on the wire."""
        return nbytes if self.dtype is None else nbytes // flat.element_size() * self.dtype.itemsize
