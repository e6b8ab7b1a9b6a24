"""The training loop's epochs, on every rank (docs/architecture.md, "The
path of one epoch's numbers"): `EpochControl` starts and ends each epoch
and hands out its batches as an `EpochBatches`, which adds to the
notebook's loop the step count, the stop agreement and injected delays.
An agreed stop is raised once, as `Stopped`; `run_training`
(rank/machinery.py) catches it. `MeasuredEpoch` and `Position` live here
so that telemetry and the checkpointer, which both take them, need not
import each other."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

import torch

from ..config import DebugConfig, TimingConfig, TrainConfig
from ..world.distributed import DistContext
from ..timing import Clock, CommStats, StepTimer, StepTimes
from ..folder import heartbeat
from .delay import ComputeDelay, fail_once
from .profile import make_profiler
from .stop import StopControl, StopInfo, stop_control


@dataclass
class Position:
    """Where a run stands: epochs done, steps done of the next epoch,
    and that partial epoch's sums so far (kept in a mid-epoch
    checkpoint)."""

    epoch: int = 0
    step: int = 0
    loss_sum: float = 0.0
    samples: int = 0
    busy_s: float = 0.0
    wall_s: float = 0.0
    # training predictions that were right (train accuracy)
    correct: int = 0


@dataclass
class MeasuredEpoch:
    """One epoch as this rank measured it (`epoch`: 1-based). Resumed
    mid-way, the fields are this allocation's part, `resumed_part` the
    checkpoint's (its loss and sample sums on rank 0 only); `totals`
    adds the two."""

    epoch: int
    # this part's phase stamps (none when timing is off)
    steps: list[StepTimes]
    comm: CommStats  # this part's collectives
    # this rank's own time, before waiting for the others at the epoch's
    # end
    busy_s: float
    # barrier to barrier: the slowest rank's time
    wall_s: float
    # this rank's training loss summed over its samples
    loss_sum: float
    samples: int
    # this rank's right training predictions
    correct: int = 0
    resumed_at_step: int = 0
    resumed_part: Position = field(default_factory=Position)
    # (loss, accuracy), after the steps
    test: tuple[float, float] = (float("nan"), float("nan"))

    def totals(self) -> tuple[float, int, int, float, float]:
        """The whole epoch on this rank: (loss sum, correct, samples,
        busy s, wall s)."""
        c = self.resumed_part
        return (c.loss_sum + self.loss_sum, c.correct + self.correct, c.samples + self.samples,
                c.busy_s + self.busy_s, c.wall_s + self.wall_s)


class Stopped(Exception):
    """Every rank agreed to stop (`info`): mid-epoch, with the epoch's
    steps so far (`measured`), or between epochs, after `epochs_done`.
    `Checkpointer.on_stop` saves it."""

    def __init__(self, info: StopInfo, measured: Optional[MeasuredEpoch] = None,
                 epochs_done: int = 0):
        super().__init__(f"{info.status}: {info.reason}")
        self.info, self.measured, self.epochs_done = info, measured, epochs_done


class EpochBatches:
    """`for x, y in batches:` gives each step's batch and, around it,
    times the data phase, runs the injected delay (a "forward" span),
    counts steps and samples, and after each step asks `stopper` whether
    every rank agreed to stop (then ends, `stop` saying why)."""

    def __init__(self, data: Iterator, steps: Iterable, timer: StepTimer,
                 stopper: Optional[StopControl] = None, delay: Optional[Callable[[], None]] = None,
                 first_step: int = 0):
        self.data, self.steps, self.timer = data, steps, timer
        self.stopper, self.delay = stopper, delay
        # steps a mid-epoch checkpoint already did
        self.first_step = first_step
        # steps and samples this rank ran in this part
        self.done, self.samples = 0, 0
        self.stop: Optional[StopInfo] = None

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in self.steps:
            with self.timer.phase("data"):
                x, y = next(self.data)
            if self.delay is not None:
                with self.timer.phase("forward"):
                    # an injected straggler: part of this rank's compute
                    self.delay()
            yield x, y  # the step runs here
            self.done, self.samples = self.done + 1, self.samples + len(y)
            if self.stopper is not None:
                # collective now and then: all stop alike
                self.stop = self.stopper.step()
                if self.stop is not None:
                    return


class EpochControl:
    """The clock around each epoch's steps: the ranks start together
    (`begin`), the epoch ends with the slowest rank (`end`, a
    `MeasuredEpoch`). Owns the step timer, the injected delay, the stop
    agreement (`stop_control`) and the failure hook
    (`between_epochs`)."""

    def __init__(self, train: TrainConfig, timing: TimingConfig, debug: DebugConfig,
                 ctx: DistContext, clock: Clock, syncer,
                 resumed_part: Callable[[int], Position], run_dir: Optional[Path] = None):
        """`resumed_part(epoch)`: the part of `epoch` a mid-epoch
        checkpoint holds; `run_dir`: where timing.profile writes its
        traces."""
        self.train = train
        self.ctx, self.clock, self.syncer = ctx, clock, syncer
        self.resumed_part = resumed_part
        self.timer = StepTimer(clock, enabled=timing.enabled)
        # its phases: where this rank is (status)
        heartbeat.current().follow(timer=self.timer)
        # compute end (each step's last gradient ready): where
        if ctx.env.world_size > 1:
            # exposed comm starts; one rank has none
            self.timer.watch_grads(syncer.module)
        # or None
        self.delay = ComputeDelay.from_config(debug, ctx.env.rank, train.seed)
        # timing.profile: torch.profiler over a few steps, the phases
        # labelled (rank/profile.py)
        self.profiler = make_profiler(timing, ctx.env.rank, ctx.device, run_dir,
                                      # None when off: nothing wrapped
                                      self.timer, syncer)
        # inside `stop_control`
        self.stopper: Optional[StopControl] = None
        self.epoch, self.t0 = 0, 0.0

    @contextmanager
    def stop_control(self, run_dir: Path) -> Iterator[None]:
        """Collective. Inside, stop signals and the stop file are heard
        and agreed on."""
        with stop_control(self.ctx, run_dir, self.train) as self.stopper:
            try:
                yield
            finally:
                self.stopper = None

    def begin(self, epoch: int, shard, steps: Callable[[int, int], Iterable]) -> EpochBatches:
        """Collective. Epoch `epoch` (0-based) starts: `shard`'s batches
        from step 0 or a mid-epoch checkpoint's; `steps(epoch,
        first_step)` numbers them."""
        skip = self.resumed_part(epoch).step
        # this epoch's shuffle, the same on every rank
        shard.set_epoch(epoch)
        self.ctx.synchronize()
        # load-bearing: every rank starts the clock together
        self.ctx.barrier()
        # the GPU is idle here: its timeline is pinned to the host clock
        self.clock.anchor()
        if self.stopper is not None:
            self.stopper.restart_clock()
        # where this rank is, for the others (status)
        heartbeat.current().at(epoch, skip)
        self.epoch, self.t0 = epoch, time.perf_counter()
        return EpochBatches(shard.iter_from(skip), steps(epoch, skip), self.timer, self.stopper,
                            self.delay, first_step=skip)

    def end(self, batches: EpochBatches, loss_sum: torch.Tensor,
            correct: torch.Tensor) -> MeasuredEpoch:
        """Collective. The epoch's steps are done (or stopped): what
        this rank measured. Raises `Stopped` (with it) when the ranks
        agreed to stop inside the epoch."""
        # wait for the GPU to finish the epoch's work
        self.ctx.synchronize()
        # this rank's own time, before waiting for the others
        busy = time.perf_counter() - self.t0
        # load-bearing: the epoch ends when the slowest rank ends
        self.ctx.barrier()
        wall = time.perf_counter() - self.t0
        # the epoch's stamps and comm, taken before the checkpoint (a
        # synchroniser may communicate to bring the optimiser state to
        # rank 0) adds to them
        steps, comm = self.timer.collect(), self.syncer.collect_comm()
        if self.profiler is not None:
            self.profiler.measured(steps, comm)
        measured = MeasuredEpoch(self.epoch + 1, steps, comm, busy, wall, loss_sum.item(),
                                 batches.samples, int(correct.item()),
                                 resumed_at_step=batches.first_step,
                                 resumed_part=self.resumed_part(self.epoch))
        if batches.stop is not None:
            raise Stopped(batches.stop, measured)
        return measured

    def between_epochs(self, epochs_done: int) -> None:
        """Collective, after an epoch's checkpoint and record: the
        failure hook (DDP_LAB_FAIL_ONCE), then, but after the last
        epoch, a stop check (`Stopped`)."""
        fail_once(self.ctx, epochs_done)
        if self.stopper is not None and epochs_done < self.train.epochs:
            info = self.stopper.check()
            if info is not None:
                raise Stopped(info, epochs_done=epochs_done)
