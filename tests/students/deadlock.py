"""Broken on purpose: every rank sends to its right neighbour first,
with a blocking send (a ring of blocked sends from 2 ranks on)."""

import torch
from torch import distributed as dist


def all_reduce_sendfirst(tensor: torch.Tensor):
    n, r = dist.get_world_size(), dist.get_rank()
    acc = tensor.clone()
    buf = torch.empty_like(tensor)
    for _ in range(n - 1):
        dist.send(acc, (r + 1) % n)
        dist.recv(buf, (r - 1) % n)
        tensor += buf
        acc = buf.clone()
