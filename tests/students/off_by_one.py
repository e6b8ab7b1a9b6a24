"""Broken on purpose: a ring whose all-gather always passes on the chunk
it finished first (it forgets `- step`): right on 2 ranks, where there
is one all-gather step, wrong from 3 ranks on."""

import torch
from torch import distributed as dist


def all_reduce_ring_chunks(tensor: torch.Tensor):
    n, r = dist.get_world_size(), dist.get_rank()
    if n == 1:
        return
    chunks = list(tensor.view(-1).tensor_split(n))
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        s, v = (r - step) % n, (r - step - 1) % n
        buf = torch.empty_like(chunks[v])
        q = [dist.isend(chunks[s].clone(), right), dist.irecv(buf, left)]
        for w in q:
            w.wait()
        chunks[v] += buf
    for step in range(n - 1):
        s, v = (r + 1) % n, (r - step) % n  # the bug: (r + 1 - step) % n
        q = [dist.isend(chunks[s].clone(), right), dist.irecv(chunks[v], left)]
        for w in q:
            w.wait()
