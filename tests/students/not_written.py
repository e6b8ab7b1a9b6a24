"""Broken on purpose: an all-reduce that returns the sum and leaves the
tensor it was given as it was."""

import torch
from torch import distributed as dist


def all_reduce_returns(tensor: torch.Tensor):
    n, r = dist.get_world_size(), dist.get_rank()
    total = tensor.clone()
    for i in range(n):
        if i == r:
            for j in range(n):
                if j != r:
                    dist.send(tensor, j)
        else:
            buf = torch.empty_like(tensor)
            dist.recv(buf, i)
            total = total + buf
    tensor = total
    return tensor
