"""The collectives exercises as stubs: write each function from
dist.send / dist.recv (and isend / irecv), then check it on real ranks:

    python -m ddp_lab.check mine.py          # every function below, worlds 1 to 7
    python -m ddp_lab.check mine.py:reduce_tree

A stub raises NotImplementedError, which the check reports as
`unsupported`. Signatures are the notebook's: no group, the whole world.
docs/exercises.md walks through the sheet.
"""

import torch
from torch import distributed as dist
from torch.distributed import ReduceOp


def broadcast_naive(tensor: torch.Tensor, src: int):
    """The root sends `tensor` to every other rank, one after another."""
    raise NotImplementedError("broadcast_naive")


def broadcast_tree(tensor: torch.Tensor, src: int):
    """Binary split: every rank that has the data sends it on, doubling
    the ranks that have it each round (any world size, not only powers
    of two)."""
    raise NotImplementedError("broadcast_tree")


def broadcast_ring(tensor: torch.Tensor, src: int):
    """Each rank passes the data to the next rank of the ring."""
    raise NotImplementedError("broadcast_ring")


def reduce_naive(tensor: torch.Tensor, dst: int, op=ReduceOp.SUM):
    """Every rank sends to `dst`, which combines (SUM, PRODUCT, MAX, MIN)
    into `tensor` itself: in place."""
    raise NotImplementedError("reduce_naive")


def reduce_tree(tensor: torch.Tensor, dst: int, op=ReduceOp.SUM):
    """Binary join: pairs combine, then pairs of pairs, down to `dst`."""
    raise NotImplementedError("reduce_tree")


def allreduce_naive(tensor: torch.Tensor, op=ReduceOp.SUM):
    """All to one to all: a reduce to rank 0, then a broadcast from it."""
    raise NotImplementedError("allreduce_naive")


def allreduce_butterfly(tensor: torch.Tensor, op=ReduceOp.SUM):
    """Butterfly: in round k each rank swaps with the rank whose number
    differs in bit k, and both combine."""
    raise NotImplementedError("allreduce_butterfly")


def gather_naive(tensor: torch.Tensor, gather_list=None, dst: int = 0):
    """(Bonus) `dst` receives every rank's `tensor` into `gather_list`
    (a list of world-size tensors on `dst`, None elsewhere)."""
    raise NotImplementedError("gather_naive")


def all_gather_naive(tensor_list, tensor: torch.Tensor):
    """(Bonus) every rank ends with every rank's `tensor` in
    `tensor_list`."""
    raise NotImplementedError("all_gather_naive")
