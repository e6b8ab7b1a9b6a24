"""sync=fsdp2: torch's FSDP2 (`torch.distributed.fsdp.fully_shard`), the
library twin of sharding one step further than sync=zero1
(docs/twins.md; keys and rules: config/sync.py; torch >= 2.6).

    wrap:     fully_shard on each child module that has parameters, then on the root: every
              parameter becomes a DTensor of which this rank keeps dim-0 chunk r (Shard(0))
    forward:  each module all-gathers its weights just before its forward; with
              sync.reshard_after_forward=true frees them right after (and gathers them again
              in backward), with false keeps them until backward is done
    backward: each module's gradients reduce-scattered (averaged) as soon as they are ready:
              this rank keeps chunk r of each gradient
    step():   the optimiser steps the local chunks: its state is 1/n of every parameter

So weights, gradients and optimiser state are all sharded (ZeRO stage
3), where zero1 shards the optimiser state only. `sync()` has nothing
left to do. Checkpoints and model.pt hold the whole model and a plain
optimiser's state (gathered with torch.distributed.checkpoint's full
state dicts), so they load into any synchroniser and world. Each
all-gather and reduce-scatter is timed through FSDP2's custom-comm hooks
(`set_custom_all_gather`, torch >= 2.8; older: bytes and times not
recorded); bytes follow the library's model. A world of one runs the
bare model."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn

from ..predict import costmodel
from ..world import torch_support
from .synchroniser import Synchroniser


def _parts(module: nn.Module) -> list[nn.Module]:
    """The modules fully_shard wraps before the root: each child that
    holds parameters."""
    return [c for c in module.children() if any(True for _ in c.parameters())]


class FSDP2Sync(Synchroniser):
    name = "fsdp2"
    # the library's collectives: modelled
    bytes_exact = False

    def wrap(self, module: nn.Module) -> nn.Module:
        self.sharded = self.world_size > 1 and dist.is_initialized()
        if not self.sharded:
            return module
        problem = torch_support.fsdp2_refusal()
        if problem:
            raise ValueError(problem)
        from torch.distributed.fsdp import fully_shard

        reshard = bool(self.cfg.reshard_after_forward)
        self.children = _parts(module)
        for child in self.children:
            fully_shard(child, reshard_after_forward=reshard)
        fully_shard(module, reshard_after_forward=reshard)
        self._time_collectives([*self.children, module])
        return module

    def _time_collectives(self, modules: list[nn.Module]) -> None:
        """Each FSDP2 all-gather and reduce-scatter counted and timed as
        one call (torch >= 2.8 has the custom-comm hooks; a torch
        without them records none)."""
        try:
            from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
                DefaultAllGather,
                DefaultReduceScatter,
            )
        except ImportError:
            return
        if not hasattr(modules[-1], "set_custom_all_gather"):
            return
        sync = self

        def record(op: str, numel: int, elem: int, start: Any, work: Any) -> Any:
            c = costmodel.cost(op, "torch", numel, sync.world_size, elem)
            args = (op, numel * elem, c.sent[sync.rank], c.recv[sync.rank])
            if work is None:
                sync.comm.finish(start, *args)
                return work
            work.get_future().then(lambda f: sync.comm.finish(start, *args))
            return work

        class TimedAllGather(DefaultAllGather):
            def __call__(self, output_tensor, input_tensor, group, async_op=False):
                start = sync.comm.begin()
                work = super().__call__(output_tensor, input_tensor, group, async_op)
                return record(
                    "all_gather", output_tensor.numel(), output_tensor.element_size(), start, work
                )

        class TimedReduceScatter(DefaultReduceScatter):
            def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
                start = sync.comm.begin()
                work = super().__call__(output_tensor, input_tensor, group, op, async_op)
                return record(
                    "reduce_scatter", input_tensor.numel(), input_tensor.element_size(), start, work
                )

        for m in modules:
            if any(True for _ in m.parameters(recurse=False)) or m is modules[-1]:
                m.set_custom_all_gather(TimedAllGather())
                m.set_custom_reduce_scatter(TimedReduceScatter())

    def no_sync(self):
        """Micro-batches before the step's last: FSDP2 keeps the
        gradients unreduced (`set_requires_gradient_sync(False)`), the
        last backward reduce-scatters their sum."""
        if not self.sharded:
            return super().no_sync()
        return self._no_gradient_sync()

    @contextmanager
    def _no_gradient_sync(self):
        self.module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.module.set_requires_gradient_sync(True)

    @contextmanager
    def evaluation(self):
        """Every FSDP module's weights gathered once (in the same order
        on every rank) and kept through the evaluation's forwards, which
        then communicate nothing (ranks may score different numbers of
        batches); sharded again after."""
        if not self.sharded:
            yield
            return
        # (the root never reshards after its forward)
        for child in self.children:
            child.set_reshard_after_forward(False, recurse=False)
        for m in [self.module, *self.children]:
            m.unshard()
        try:
            yield
        finally:
            for m in [self.module, *self.children]:
                m.reshard()
            for child in self.children:
                child.set_reshard_after_forward(bool(self.cfg.reshard_after_forward), recurse=False)
            # the evaluation's all-gathers are no training step's
            self.collect_comm()

    # ---------------------------------------------------------------- what a rank holds
    def held(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's shard of a parameter, its gradient or its
        optimiser state (`memory`)."""
        return t.to_local() if hasattr(t, "to_local") else t

    # ------------------------------------------------------------------ checkpoints
    def _options(self, **kw: Any):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, **kw)

    def model_state(self) -> Optional[dict]:
        """Collective: the whole model's weights, gathered, on rank
        0."""
        if not self.sharded:
            return super().model_state()
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        full = get_model_state_dict(self.module, options=self._options(cpu_offload=True))
        return full if self.rank == 0 else None

    def load_model_state(self, state: dict) -> None:
        if not self.sharded:
            return super().load_model_state(state)
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.module, state, options=self._options())

    def _names(self) -> list[str]:
        return [n for n, _ in self.module.named_parameters()]

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> Optional[dict]:
        """Collective: a plain optimiser's state over every parameter
        (indices in `module.parameters()` order, as every synchroniser's
        checkpoint holds), on rank 0."""
        if not self.sharded:
            return super().optimizer_state(optimizer)
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        full = get_optimizer_state_dict(
            self.module, optimizer, options=self._options(cpu_offload=True)
        )
        if self.rank != 0:
            return None
        index = {n: i for i, n in enumerate(self._names())}
        return {
            "state": {index[n]: s for n, s in full["state"].items()},
            "param_groups": [
                {**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]
            ],
        }

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Any sync's checkpoint (a plain optimiser's state over every
        parameter): this rank's chunk of each per-element state cut out
        of it, as FSDP2 cuts the parameter (dim-0 `torch.chunk`), no
        communication."""
        if not self.sharded:
            return super().load_optimizer_state(optimizer, state)
        from torch.distributed.tensor import DTensor

        params = list(self.module.parameters())
        local: dict[int, dict] = {}
        for i, s in state["state"].items():
            p = params[int(i)]
            local[int(i)] = {k: self._shard(v, p, DTensor) for k, v in s.items()}
        optimizer.load_state_dict({"state": local, "param_groups": state["param_groups"]})

    def _shard(self, v: Any, p: torch.Tensor, dtensor: Any) -> Any:
        """`v` (a whole parameter's state) as a DTensor sharded as `p`
        is; a scalar as is."""
        if not (torch.is_tensor(v) and v.shape == p.shape and v.dim() > 0):
            return v
        chunks = torch.chunk(v.to(p.device), self.world_size, dim=0)
        mine = chunks[self.rank] if self.rank < len(chunks) else v.new_empty((0, *v.shape[1:]))
        return dtensor.from_local(
            mine.clone(),
            p.device_mesh,
            p.placements,
            shape=p.shape,
            stride=p.stride(),
            run_check=False,
        )
