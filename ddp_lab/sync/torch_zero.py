"""sync=torch_zero: torch's ZeroRedundancyOptimizer over DDP, the
library twin of sync=zero1 (docs/twins.md; keys and rules:
config/sync.py).

    backward: DDP all-reduces the gradients (sync=ddp's timed hook, buckets and all)
    step():   ZeroRedundancyOptimizer steps the parameters this rank owns, then every rank
              broadcasts its own to the others (one timed call: the broadcasts of a step)

What differs from zero1: ZeRO places *whole parameters* on ranks,
greedily (the largest first, each to the rank that holds the fewest
elements so far), so one rank may hold the state of a 400k-element
weight matrix and another of a bias; zero1 cuts one flat bucket into n
equal shards. And the gradients travel whole (an all-reduce, not a
reduce-scatter): every rank computes the average of every gradient and
throws most of it away. Checkpoints hold a plain optimiser's state over
every parameter (`consolidate_state_dict` brings the shards to rank 0),
so they load into any synchroniser and any world."""

# no `from __future__ import annotations`: DDP checks the hook's
# annotations at runtime

from typing import Callable, Optional

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

from ..predict import costmodel
from .ddp import DDPSync


class TorchZeroSync(DDPSync):
    name = "torch_zero"
    # the library's all-reduce and broadcasts: modelled
    bytes_exact = False

    def make_optimizer(
        self, build: Callable[[list], torch.optim.Optimizer]
    ) -> torch.optim.Optimizer:
        """The config's optimiser as ZeroRedundancyOptimizer's
        `optimizer_class`, with the settings `build` gave it (lr, betas,
        fused, ...)."""
        # holds no state until it steps: dropped
        plain = build(self.optimizer_params())
        if self.world_size == 1:
            return plain
        defaults = {k: v for k, v in plain.defaults.items()}
        zero = ZeroRedundancyOptimizer(
            self.optimizer_params(), optimizer_class=type(plain), **defaults
        )
        self._time_broadcasts(zero)
        return zero

    def _time_broadcasts(self, zero: ZeroRedundancyOptimizer) -> None:
        """Every rank's broadcast of the parameters it owns
        (`_sync_params`, torch's), timed as one call: payload every
        parameter's bytes, this rank's bytes by the library broadcast's
        model, per owner."""
        # rank -> elements it owns and broadcasts
        owners: dict[int, int] = {}
        for rank, groups in enumerate(zero._partition_parameters()):
            owners[rank] = sum(p.numel() for g in groups for p in g["params"])
        elem = next(iter(self.module.parameters())).element_size()
        sent = recv = 0
        for owner, numel in owners.items():
            if numel:
                c = costmodel.cost("broadcast", "torch", numel, self.world_size, elem, root=owner)
                sent, recv = sent + c.sent[self.rank], recv + c.recv[self.rank]
        payload = sum(owners.values()) * elem
        sync_params = zero._sync_params

        def timed_sync_params() -> None:
            with self.comm.timed("broadcast", payload, sent, recv):
                sync_params()

        # (an instance attribute: step() calls it)
        zero._sync_params = timed_sync_params

    def traffic(self, op: str, numel: int, elem_size: int) -> tuple[int, int, Optional[int]]:
        """DDP's bucket all-reduces: the library's, modelled as
        sync=ddp's."""
        c = costmodel.cost(op, "torch", numel, self.world_size, elem_size)
        return c.sent[self.rank], c.recv[self.rank], None

    def memory(self, optimizer: torch.optim.Optimizer) -> dict[str, int]:
        """The local optimiser's state only: the parameters this rank
        owns."""
        return super().memory(getattr(optimizer, "optim", optimizer))

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> Optional[dict]:
        """Collective: every rank's shard consolidated on rank 0, a
        plain optimiser's state over every parameter there (global
        indices: `module.parameters()`' order)."""
        if not isinstance(optimizer, ZeroRedundancyOptimizer):
            return super().optimizer_state(optimizer)
        optimizer.consolidate_state_dict(to=0)
        if self.rank != 0:
            return None
        state = optimizer.state_dict()
        groups = [{k: v for k, v in g.items()} for g in state["param_groups"]]
        return {"state": state["state"], "param_groups": groups}

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """A plain optimiser's state over every parameter (any sync's,
        any world's): ZeRO keeps the part of the parameters this rank
        owns."""
        if not isinstance(optimizer, ZeroRedundancyOptimizer):
            return super().load_optimizer_state(optimizer, state)
        # (a copy: ZeRO drops the entries of other ranks' parameters in
        # place, and keeps the tensors of its own as they are, which may
        # be another optimiser's live state)
        optimizer.load_state_dict(
            {
                "state": {
                    i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
                    for i, s in state["state"].items()
                },
                "param_groups": [dict(g) for g in state["param_groups"]],
            }
        )
