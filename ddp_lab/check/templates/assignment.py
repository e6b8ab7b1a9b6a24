"""The assignment's collectives as stubs, with torch.distributed's
signatures (`group=None` is the whole world): a ring all-reduce from
send/recv, AllGather and ReduceScatter. Check, then measure, then train:

    python -m ddp_lab.check mine.py
    python -m ddp_lab.bench 'bench.impl=[torch,mine.py:all_reduce_ring]' launcher.nproc_per_node=4
    python -m ddp_lab sync=custom sync.all_reduce=mine.py:all_reduce_ring launcher.nproc_per_node=3

docs/exercises.md walks through it.
"""

import torch
from torch import distributed as dist
from torch.distributed import ReduceOp


def all_reduce_ring(tensor: torch.Tensor, op=ReduceOp.SUM, group=None):
    """Sum `tensor` over the ranks, in place: a reduce-scatter (n-1
    steps, each rank sends one chunk to the next rank and adds the one
    it receives) then an all-gather (n-1 steps). Any size, any world:
    chunks of unequal length where the size is not a multiple of it."""
    raise NotImplementedError("all_reduce_ring")


def all_gather_ring(output: torch.Tensor, input: torch.Tensor, group=None):
    """`output` (world x input.numel() elements) ends with every rank's
    `input`, rank r's at [r * n, (r + 1) * n)."""
    raise NotImplementedError("all_gather_ring")


def reduce_scatter_ring(output: torch.Tensor, input: torch.Tensor, op=ReduceOp.SUM,
                        group=None):
    """Rank r's `output` ends with the sum over ranks of piece r of
    `input` (world x output.numel() elements)."""
    raise NotImplementedError("reduce_scatter_ring")
