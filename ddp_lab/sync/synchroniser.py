"""The synchroniser interface: wrap the model once, synchronise after
backward, report.

A training step with any synchroniser reads

    out = syncer.wrapped(x); loss = ...; loss.backward()
    syncer.sync()          # make every rank's .grad the average over ranks
    syncer.step(optimizer) # usually optimizer.step(); reduce_broadcast steps on the root only,
                           # zero1 each rank its shard (the optimiser is built over
                           # syncer.optimizer_params())

and `syncer.close()` (collective) follows the last step.
`syncer.collect_comm()` returns what was communicated since the last
call (a `CommStats`: calls, payload bytes, bytes this rank sent and
received, in-flight time). Every collective a synchroniser runs sits
inside one call, `with self.timed(op, tensor):`, which takes the bytes
this rank sends and receives from the cost model
(`ddp_lab.predict.costmodel`, per `SYNC_COLLECTIVES[name]`; worked out
once per tensor shape, as a step's buffers are the same every step) and
hands them to `self.comm` (a `CommRecorder`): it counts the call and its
bytes always and stamps its start and end on the run's `Clock` when
timing is enabled. That is how comm time is measured the same way for
every synchroniser, and why a synchroniser's body reads as its
algorithm.

A synchroniser that cannot run a configuration says so in its section's
`check` (its schema, config/sync.py: config only, run before any
process starts and again where it is built, `build_sync` in
sync/build.py) or in `preflight` (needs the model and a batch; called
once before the first step), never by hanging in a collective. Besides
the interface, the class holds only what every synchroniser shares: the
byte counting above (`timed`, `traffic`) and the bytes a rank holds
(`memory`).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import nn

from ..config import SyncConfig, with_defaults
from ..predict import costmodel
from ..timing import Clock, CommRecorder, CommStats


class Synchroniser:
    name = "base"
    #: whether bytes_sent/bytes_recv are this rank's exact traffic (our
    #: send/recv algorithms) or the textbook model of a backend
    #: collective whose routing we cannot see
    bytes_exact = False
    # the destination of a rooted collective (reduce);
    # reduce_broadcast's sync.root
    root = 0

    def __init__(
        self,
        cfg: SyncConfig,
        module: nn.Module,
        device: torch.device,
        world_size: int,
        clock: Optional[Clock] = None,
        timing: bool = True,
    ):
        # keys a plain section lacks read as their defaults
        self.cfg = with_defaults(cfg)
        # the bare model: evaluation and checkpoints use this
        self.module = module
        self.device = device
        self.world_size = world_size
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.comm = CommRecorder(clock or Clock(device), world_size, enabled=timing)
        self.bytes_by_shape: dict[tuple[str, int, int], tuple[int, int, Optional[int]]] = {}
        self.wrapped: nn.Module = self.wrap(module)

    def wrap(self, module: nn.Module) -> nn.Module:
        """The module the training step calls (DDP wraps; the others
        return it as is)."""
        return module

    def preflight(self, loss_fn: Callable[..., torch.Tensor]) -> None:
        """Checks and warm-ups that need the model and a batch:
        `loss_fn()` computes a loss on the bare module, `loss_fn(model)`
        on another (the wrapped one). Runs before the first step, on
        every rank; default: nothing to do."""

    def sync(self) -> None:
        """Average gradients across ranks (in place, in .grad)."""

    def no_sync(self):
        """Context of a backward whose gradients only accumulate (a
        micro-batch before the step's last, train.micro_batch): nothing
        may communicate inside it. Ours sync only when `sync()` is
        called, so there is nothing to hold back; DDP overrides it."""
        return nullcontext()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def optimizer_params(self) -> list[torch.Tensor]:
        """What the optimiser is built over: every parameter of the
        module (zero1: only this rank's shards of them)."""
        return list(self.module.parameters())

    def make_optimizer(
        self, build: Callable[[list[torch.Tensor]], torch.optim.Optimizer]
    ) -> torch.optim.Optimizer:
        """The optimiser the step uses, from `build(params)` (the
        config's optimiser over `params`):
        `build(self.optimizer_params())`; torch_zero wraps it in torch's
        ZeroRedundancyOptimizer."""
        return build(self.optimizer_params())

    def model_state(self) -> Optional[dict]:
        """Collective: the whole model's state dict (plain tensors) on
        rank 0, None elsewhere; fsdp2 gathers its shards."""
        return self.module.state_dict() if self.rank == 0 else None

    def load_model_state(self, state: dict) -> None:
        """Load a whole-model state dict (`model_state`'s format); fsdp2
        cuts its shards."""
        self.module.load_state_dict(state)

    def evaluation(self):
        """Context around the evaluation of the bare module (every rank
        scores its share of the test set, each its own number of
        batches): fsdp2 gathers its weights once in it, so no forward
        communicates. Default: nothing to do."""
        return nullcontext()

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Load a checkpoint's optimiser state (`optimizer_state`'s
        format: a plain optimiser's over every parameter); zero1 cuts
        out its shard."""
        optimizer.load_state_dict(state)

    def held(self, t: torch.Tensor) -> torch.Tensor:
        """The part of `t` this rank holds: all of it (fsdp2: its
        shard)."""
        return t

    def memory(self, optimizer: torch.optim.Optimizer) -> dict[str, int]:
        """Bytes this rank holds (`held`): parameters, their gradients
        (each rank computes the whole gradient in backward, whatever the
        sync) and the optimiser's state tensors."""
        local = self.held
        params = list(self.module.parameters())
        state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        return {
            "param_bytes": sum(local(p).nbytes for p in params),
            "grad_bytes": sum(local(p).nbytes for p in params if p.requires_grad),
            "optimizer_state_bytes": sum(local(v).nbytes for v in state),
        }

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> Optional[dict]:
        """The optimiser state a checkpoint on rank 0 should hold.
        Called on every rank (a synchroniser may need a collective to
        bring it to rank 0); None off rank 0."""
        return optimizer.state_dict() if self.rank == 0 else None

    def close(self) -> None:
        """Collective, after the last step: release what the
        synchroniser keeps in flight between steps (ring's pre-posted
        receives). Default: nothing."""

    def timed(self, op: str, wire: torch.Tensor, payload: Optional[int] = None):
        """Context of one collective `op` on `wire` (the tensor that
        goes on the wire), counted and timed: `with
        self.timed("all_reduce", g): dist.all_reduce(g)`. The bytes this
        rank sends and receives come from `traffic`; `payload` is the
        bytes the call stands for (default: `wire`'s own; sync.compress
        passes the gradients' bytes in the wire dtype, padding
        excluded)."""
        shape = (op, wire.numel(), wire.element_size())
        traffic = self.bytes_by_shape.get(shape)
        # the first call of this shape: its bytes, from `traffic`
        if traffic is None:
            traffic = self.bytes_by_shape[shape] = self.traffic(*shape)
        if payload is None:
            payload = shape[1] * shape[2]
        return self.comm.timed(op, payload, *traffic)

    def traffic(self, op: str, numel: int, elem_size: int) -> tuple[int, int, Optional[int]]:
        """This rank's (bytes sent, bytes received, bytes sent to
        another node or None when the algorithm does not know the nodes)
        for one `op` of `numel` elements, by the cost model of the
        algorithm `costmodel.SYNC_COLLECTIVES[self.name]` names for
        `op`."""
        algorithm = dict(costmodel.SYNC_COLLECTIVES[self.name])[op]
        c = costmodel.cost(op, algorithm, numel, self.world_size, elem_size, root=self.root)
        return c.sent[self.rank], c.recv[self.rank], None

    def collect_comm(self) -> CommStats:
        """What was communicated since the last call; resolves CUDA
        events (one sync)."""
        return self.comm.collect()
