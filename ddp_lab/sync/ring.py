"""sync=ring: bandwidth-optimal ring all-reduce, built from send/recv, on flat buckets.

`ddp_lab.collectives.all_reduce_ring`: a reduce-scatter (n-1 steps, each rank sends one
chunk to the next rank and adds the one it receives) then an all-gather (n-1 steps that
circulate the reduced chunks). Each bucket buffer is padded to a multiple of the world
size, so the n chunks are equal and every rank sends and receives exactly
2(n-1)/n of the (padded) buffer per call: the minimum any all-reduce can do, whatever n.
"""

from __future__ import annotations

import torch

from ..collectives import all_reduce_ring
from .allreduce import AllReduceSync


class RingSync(AllReduceSync):
    name = "ring"
    bytes_exact = True
    pad_to_world = True

    def all_reduce(self, flat: torch.Tensor) -> None:
        all_reduce_ring(flat)

    def traffic(self, flat: torch.Tensor) -> tuple[int, int]:
        n = self.world_size
        chunk = flat.numel() // n * flat.element_size()  # exact: numel is a multiple of n
        b = 2 * (n - 1) * chunk
        return b, b
