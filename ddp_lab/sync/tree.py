"""sync=tree: binomial-tree reduce to rank 0, then binomial-tree
broadcast, on flat buckets.

`ddp_lab.collectives.all_reduce_tree`. Rank v's parent is v minus its
lowest set bit and its children are v + 2^k for every 2^k below that bit
(rank 0: every 2^k < n), so the reduce and the broadcast each take
ceil(log2 n) rounds. A rank sends and receives the whole buffer once per
tree edge it has: once to/from its parent, once per child. That is
log2(n) times the ring's traffic at the root, for log2(n) instead of
2(n-1) latencies: the tree wins on small buffers and many ranks, the
ring on large buffers.

Its keys and rules are allreduce's (config/sync.py), and so
are overlap (overlap.py) and compression (`_reduce`, allreduce.py).
"""

from __future__ import annotations

import torch

from ..collectives import all_reduce_tree
from .allreduce import AllReduceSync


class TreeSync(AllReduceSync):
    name = "tree"
    bytes_exact = True

    def all_reduce(self, flat: torch.Tensor) -> None:
        all_reduce_tree(flat)
