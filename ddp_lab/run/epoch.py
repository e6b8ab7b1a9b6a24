"""One epoch as this rank measured it (`MeasuredEpoch`) and where a run stands
(`Position`): what the training loop hands to `Telemetry.epoch` (records) and to the
`Checkpointer` (a graceful stop's checkpoint), in a module both import, so that neither
imports the other; and `EpochMeter`, the clock around each epoch's steps that makes them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..config import Config
from ..distributed import DistContext
from ..timing import Clock, CommStats, StepTimer, StepTimes
from . import progress
from .delay import ComputeDelay
from .stop import StopControl


@dataclass
class Position:
    """Where a run stands: epochs done, steps done of the next epoch, and that partial
    epoch's sums so far (carried through a mid-epoch checkpoint)."""

    epoch: int = 0
    step: int = 0
    loss_sum: float = 0.0
    samples: int = 0
    busy_s: float = 0.0
    wall_s: float = 0.0
    correct: int = 0  # training predictions that were right (train accuracy)


@dataclass
class MeasuredEpoch:
    """One epoch as this rank measured it, handed whole to `Telemetry.epoch` (and, when the
    ranks stopped inside it, to `Checkpointer.on_stop`). `epoch` is 1-based: the epochs
    done when it ends. An epoch resumed mid-way (`resumed_at_step` > 0) was run by two
    allocations: the fields are this one's part, `carried` the part the checkpoint held
    (`Checkpointer.carried`: its global loss and sample sums on rank 0 only, its times on
    every rank); `totals` adds the two."""

    epoch: int
    steps: list[StepTimes]  # this part's phase stamps (none when timing is off)
    comm: CommStats  # this part's collectives
    busy_s: float  # this rank's own time, before waiting for the others at the epoch's end
    wall_s: float  # barrier to barrier: the slowest rank's time
    loss_sum: float  # this rank's training loss summed over its samples
    samples: int
    correct: int = 0  # this rank's right training predictions
    resumed_at_step: int = 0
    carried: Position = field(default_factory=Position)
    test: tuple[float, float] = (float("nan"), float("nan"))  # (loss, accuracy), after the steps

    def totals(self) -> tuple[float, int, int, float, float]:
        """The whole epoch on this rank: (loss sum, correct, samples, busy s, wall s)."""
        c = self.carried
        return (c.loss_sum + self.loss_sum, c.correct + self.correct, c.samples + self.samples,
                c.busy_s + self.busy_s, c.wall_s + self.wall_s)


class EpochMeter:
    """The clock around each epoch's steps, on every rank: the ranks start it together,
    the epoch ends when the slowest rank ends, and what the epoch measured comes back as
    one `MeasuredEpoch`, with the part a mid-epoch checkpoint carried. It holds the step
    timer and the injected delay (debug.*) that `run_steps` takes."""

    def __init__(self, cfg: Config, ctx: DistContext, clock: Clock, syncer,
                 carried: Callable[[int], Position]):
        """`carried(epoch)`: the part of `epoch` a mid-epoch checkpoint holds
        (`Checkpointer.carried`)."""
        self.cfg, self.ctx, self.clock, self.syncer = cfg, ctx, clock, syncer
        self.carried = carried
        record = progress.current()  # each phase and step's end says where this rank is
        self.timer = StepTimer(clock, enabled=cfg.timing.enabled,
                               on_phase=record.phase, on_step_end=record.step_done)
        self.timer.watch_grads(syncer.module)  # compute end: each step's last gradient ready
        self.delay = ComputeDelay.from_config(cfg.debug, ctx.env.rank, cfg.train.seed)  # or None
        self.epoch, self.skip, self.t0 = 0, 0, 0.0

    def begin(self, epoch: int, stopper: StopControl) -> int:
        """Collective. Epoch `epoch` (0-based) starts; the step it starts at: 0, or in the
        epoch the run resumes in, the steps its mid-epoch checkpoint holds."""
        skip = self.carried(epoch).step
        self.ctx.synchronize()
        self.ctx.barrier()  # load-bearing: every rank starts the clock together
        self.clock.anchor()  # the GPU is idle here: its timeline is pinned to the host clock
        stopper.restart_clock()
        progress.current().at(epoch, skip)  # where this rank is, for the others (status)
        self.epoch, self.skip, self.t0 = epoch, skip, time.perf_counter()
        return skip

    def end(self, loss_sum: torch.Tensor, correct: torch.Tensor, samples: int) -> MeasuredEpoch:
        """Collective. The epoch's steps are done (or stopped): what this rank measured."""
        self.ctx.synchronize()  # wait for the GPU to finish the epoch's work
        busy = time.perf_counter() - self.t0  # this rank's own time, before waiting for the others
        self.ctx.barrier()  # load-bearing: the epoch ends when the slowest rank ends
        wall = time.perf_counter() - self.t0
        # the epoch's stamps and comm, taken before the checkpoint (a synchroniser may
        # communicate to bring the optimiser state to rank 0) adds to them
        steps, comm = self.timer.collect(), self.syncer.take_comm()
        return MeasuredEpoch(self.epoch + 1, steps, comm, busy, wall, loss_sum.item(), samples,
                             int(correct.item()), resumed_at_step=self.skip,
                             carried=self.carried(self.epoch))
