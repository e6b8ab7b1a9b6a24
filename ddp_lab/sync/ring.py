"""sync=ring: bandwidth-optimal ring all-reduce, built from send/recv,
on flat buckets.

The ring is `ddp_lab.collectives.ring` (read it first: one screen): a
reduce-scatter (n-1 steps, each rank sends one chunk to the next rank
and adds the one it receives) then an all-gather (n-1 steps that
circulate the reduced chunks). Each bucket buffer is padded to a
multiple of the world size, so the n chunks are equal and every rank
sends and receives exactly 2(n-1)/n of the (padded) buffer per call: the
minimum any all-reduce can do.

Which transport carries the steps (the same steps, bytes and bits;
docs/collectives.md, *Optimising the ring*, has the measured reason for
each):

* gloo (the default, `sync.prepost=false`): `all_reduce_ring_textbook`,
  plain isend/irecv step by step: the ring as a textbook writes it, and
  as ddp_lab/one_file.py does.
* gloo, `sync.prepost=true` (an optimisation asked for): a
  `PrepostedRingAllReduce` per bucket, the next call's receives posted
  as soon as this call ends. gloo's TCP transport holds a send until the
  receiver has posted its receive; posted a call ahead, every send
  leaves at once. `close()` answers the receives left posted after the
  last step.
* nccl: `all_reduce_ring`, each step's send and receive one batch (nccl
  needs the pair in one group).

Its keys and rules: config/sync.py. Overlap (allreduce.py) and
compression (`_reduce`, allreduce.py) are allreduce's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..collectives import (
    PrepostedRingAllReduce,
    preposted_plans,
    all_reduce_ring,
    all_reduce_ring_textbook,
)
from .allreduce import AllReduceSync


class RingSync(AllReduceSync):
    name = "ring"
    bytes_exact = True
    pad_to_world = True

    def wrap(self, module: nn.Module) -> nn.Module:
        module = super().wrap(module)
        # one plan per bucket buffer, looked up by its address (buffers
        # never move)
        self.plans: dict[int, PrepostedRingAllReduce] = {}
        # the textbook ring's, per dtype
        self.landing: dict[torch.dtype, torch.Tensor] = {}
        self.textbook = self.world_size > 1 and dist.get_backend() == "gloo"
        # the tensors that go on the wire (sync.compress: the 16-bit
        # copies)
        wires = [self.wire.buffer(b.buffer) for b in self.buckets]
        if self.cfg.prepost and self.textbook and self.device.type == "cpu":
            self.plans = preposted_plans(wires)
        elif self.textbook:
            # a chunk of the longest buffer: one call at a time uses it
            for w in sorted(wires, key=torch.Tensor.numel):
                self.landing[w.dtype] = torch.empty_like(
                    w.tensor_split(self.world_size)[0]
                )
        return module

    def all_reduce(self, flat: torch.Tensor) -> None:
        plan = self.plans.get(flat.data_ptr())
        if plan is not None:
            plan(flat)
        elif self.textbook:
            all_reduce_ring_textbook(
                flat, landing=self.landing.get(flat.dtype)
            )
        else:
            all_reduce_ring(flat)

    def close(self) -> None:
        # (overlapped: its thread, which calls the plans, is closed
        # first)
        super().close()
        for plan in self.plans.values():
            plan.close()
