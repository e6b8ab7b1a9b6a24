"""sync=ddp: torch's DistributedDataParallel, its bucket all-reduces timed by a comm hook.

The hook wraps DDP's own all-reduce of each bucket, so overlap with backward stays real:
the hook starts the collective and returns its future; the time is read when the future
completes (on CUDA, by events recorded on the stream the completion callback runs on).
"""

# no `from __future__ import annotations`: DDP checks the hook's annotations at runtime

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .base import Synchroniser


class DDPSync(Synchroniser):
    name = "ddp"

    def wrap(self, module: nn.Module) -> nn.Module:
        cfg = self.cfg
        if cfg.static_graph and cfg.find_unused_parameters:
            raise ValueError("sync.static_graph=true and sync.find_unused_parameters=true "
                             "contradict each other: set one of them to false")
        ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DDP(module, device_ids=ids, bucket_cap_mb=cfg.bucket_cap_mb,
                  gradient_as_bucket_view=cfg.gradient_as_bucket_view,
                  static_graph=cfg.static_graph,
                  find_unused_parameters=cfg.find_unused_parameters)
        ddp.register_comm_hook(self, _timed_allreduce_hook)
        return ddp


def _timed_allreduce_hook(state: "DDPSync", bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default hook (all-reduce, then divide by world size), plus accounting."""
    buf = bucket.buffer()
    n = state.world_size
    nbytes = buf.numel() * buf.element_size()
    # ring all-reduce (what gloo and nccl run for large buffers): 2(n-1)/n of the buffer
    # leaves and enters each rank
    wire = int(2 * (n - 1) / n * nbytes) if n > 1 else 0
    if buf.is_cuda:
        start = torch.cuda.Event(enable_timing=True)
        start.record()
    else:
        t0 = time.perf_counter()
    buf.div_(n)
    fut = dist.all_reduce(buf, async_op=True).get_future()

    def done(f: torch.futures.Future) -> torch.Tensor:
        if buf.is_cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()  # the callback runs on a stream ordered after the collective
            state.pending_cuda.append((nbytes, wire, start, end))  # read at take_comm()
        else:
            state.comm.add(nbytes, wire, wire, time.perf_counter() - t0)
        return f.value()[0]

    return fut.then(done)
