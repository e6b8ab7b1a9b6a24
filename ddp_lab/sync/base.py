"""The synchroniser interface: wrap the model once, synchronise after backward, report.

A training step with any synchroniser reads

    out = syncer.model(x); loss = ...; loss.backward()
    syncer.sync()          # make every rank's .grad the average over ranks
    syncer.step(optimizer) # usually optimizer.step(); reduce_broadcast steps on the root only

and `syncer.comm` holds what was communicated (calls, bytes, seconds) since the last reset.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..timing import CommStats


class Synchroniser:
    name = "base"
    comm_op = "all_reduce"  # the collective whose bus-bandwidth factor applies

    def __init__(self, cfg: Any, module: nn.Module, device: torch.device, world_size: int):
        self.cfg = cfg
        self.module = module  # the bare model: evaluation and checkpoints use this
        self.device = device
        self.world_size = world_size
        self.comm = CommStats()
        self.pending_cuda: list = []  # (payload, wire bytes, start event, end event)
        self.model: nn.Module = self.wrap(module)

    def wrap(self, module: nn.Module) -> nn.Module:
        """The module the training step calls (DDP wraps; the others return it as is)."""
        return module

    def sync(self) -> None:
        """Average gradients across ranks (in place, in .grad)."""

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def take_comm(self) -> CommStats:
        """What was communicated since the last call; resolves CUDA events (one sync)."""
        if self.pending_cuda:
            torch.cuda.synchronize(self.device)  # events must have completed to be read
            for payload, wire, start, end in self.pending_cuda:
                self.comm.add(payload, wire, wire, start.elapsed_time(end) / 1e3)
            self.pending_cuda.clear()
        return self.comm.reset()

    def grad_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.module.parameters() if p.requires_grad)
