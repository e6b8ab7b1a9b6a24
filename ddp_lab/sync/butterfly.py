"""sync=butterfly: recursive-doubling all-reduce, any world size, on
flat buckets.

`ddp_lab.collectives.all_reduce_butterfly`. With p the largest power of
two <= n, ranks p..n-1 first fold their buffer into ranks 0..n-p-1;
ranks 0..p-1 then exchange the whole buffer with partner rank XOR 2^k
for k = 0..log2(p)-1, adding what they receive (a+b == b+a bitwise, so
partners stay identical); the folded ranks get the result back. log2(p)
(+2 when n is not a power of two) latencies, log2(p) whole buffers each
way per rank.

Its keys and rules are allreduce's (config/sync.py), and so
are overlap (overlap.py) and compression (`_reduce`, allreduce.py).
"""

from __future__ import annotations

import torch

from ..collectives import all_reduce_butterfly
from .allreduce import AllReduceSync


class ButterflySync(AllReduceSync):
    name = "butterfly"
    bytes_exact = True

    def all_reduce(self, flat: torch.Tensor) -> None:
        all_reduce_butterfly(flat)
