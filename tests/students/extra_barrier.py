"""Broken on purpose: the root calls barrier once more than every other
rank (the notebook's reduce_naive has the same shape of bug)."""

import torch
from torch import distributed as dist


def reduce_extra_barrier(tensor: torch.Tensor, dst: int):
    n, r = dist.get_world_size(), dist.get_rank()
    if r == dst:
        buf = torch.empty_like(tensor)
        for i in range(n):
            if i != dst:
                dist.recv(buf, i)
                tensor += buf
        dist.barrier()
    else:
        dist.send(tensor, dst)
