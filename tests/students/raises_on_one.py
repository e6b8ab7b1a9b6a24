"""Broken on purpose: the last rank raises before it sends."""

import torch
from torch import distributed as dist


def reduce_last_raises(tensor: torch.Tensor, dst: int):
    n, r = dist.get_world_size(), dist.get_rank()
    if r == dst:
        buf = torch.empty_like(tensor)
        for i in range(n):
            if i != dst:
                dist.recv(buf, i)
                tensor += buf
    else:
        if r == n - 1:
            raise ValueError(f"rank {r} has nothing to send")
        dist.send(tensor, dst)
