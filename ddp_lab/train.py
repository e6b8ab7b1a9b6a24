"""The loop every rank runs: the course notebook's loop plus a sync.

    data -> model -> synchroniser -> optimiser
    each epoch: its batches, run_steps (step.py), evaluate

What a real run adds is handed in as three parts, each called where it
acts: the `checkpoint` (load where to start, save after each epoch),
the `epochs` (this epoch's batches, the stop every rank agreed on, the
failure hook) and the `records` (each epoch's figures, the run's
summary). The worker builds the real ones (ddp_lab/rank/main.py,
`run_training`); the null twins below keep nothing, never stop and
write nothing, so `train(cfg, ctx)` is the bare loop.

The steps run one of three ways (ddp_lab/fast_step.py): eagerly
(`run_steps`), the model compiled first (train.compile), or each step
replayed as one CUDA graph (train.cuda_graph: `GraphedSteps`).
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple, Optional, Protocol

import torch

from .config import Config, DataConfig, TrainConfig, batch_plan
from .data import Splits, build_splits
from .data_fetch import prepare_mnist
from .fast_step import graph_stream, graphed_steps, prepare_steps
from .models import build_model, build_optimizer
from .step import evaluate, run_steps
from .sync import Synchroniser, build_sync
from .timing import Clock, StepTimer
from .world.distributed import DistContext


class Parts(NamedTuple):
    """What training builds: the same on every rank."""

    model: torch.nn.Module
    syncer: Synchroniser
    optimizer: torch.optim.Optimizer


class Start(NamedTuple):
    """Where a run starts: epochs done, steps done of the next."""

    epoch: int = 0
    step: int = 0


class Checkpoint(Protocol):
    """The run's checkpoints (rank/checkpoint.py)."""

    def load(self, parts: Parts) -> Start:
        """Where to start; a checkpoint's state restored into `parts`."""

    def save(self, epochs_done: int) -> None:
        """After an epoch: its checkpoint."""

    def save_stop(self, stop: Any, epochs_done: int, measured: Any = None) -> dict:
        """Where a stop leaves the run, saved: what the records say of it."""


class Epochs(Protocol):
    """The epochs and the stop every rank agrees on (rank/epochs.py)."""

    def start(self, clock: Clock, timer: StepTimer, parts: Parts, start: Start) -> None:
        """The run starts at `start`: stops are heard from here."""

    def batches(self, epoch: int, shard: Any) -> Iterable:
        """Epoch `epoch`'s batches of this rank's shard."""

    def end(self, batches: Iterable, loss_sum: torch.Tensor,
            correct: torch.Tensor) -> tuple[Any, Optional[Any]]:
        """The epoch's steps ended: what was measured, and a stop
        the ranks agreed on mid-epoch (or None)."""

    def between(self, epochs_done: int) -> Optional[Any]:
        """The failure hook, then a stop the ranks agreed on (or None)."""


class Records(Protocol):
    """The run's records (rank/records.py)."""

    def start(self, start: Start, timer: StepTimer, parts: Parts, splits: Splits,
              compile_s: Optional[float]) -> None:
        """The run starts at `start`."""

    def epoch(self, measured: Any, test: tuple[float, float]) -> None:
        """An epoch ended with this test loss and accuracy."""

    def stopped(self, parts: Parts, saved: dict, measured: Any = None) -> Any:
        """A stop ended the run where `saved` says: its summary."""

    def finished(self, epochs_done: int) -> Any:
        """A finished run started again: its summary as it is."""

    def finish(self, parts: Parts) -> Any:
        """The run's summary."""


class NoCheckpoint:
    """Nothing kept: every run starts at epoch 0."""

    def load(self, parts):
        return Start()

    def save(self, epochs_done):
        pass

    def save_stop(self, stop, epochs_done, measured=None):
        return {}


class EveryBatch:
    """Every batch of the shard, each epoch; no stop."""

    def start(self, clock, timer, parts, start):
        pass

    def batches(self, epoch, shard):
        shard.set_epoch(epoch)
        return shard.iter_from(0)

    def end(self, batches, loss_sum, correct):
        return None, None

    def between(self, epochs_done):
        return None


class NoRecords:
    """Nothing written: the run's result is its parts."""

    def start(self, start, timer, parts, splits, compile_s):
        pass

    def epoch(self, measured, test):
        pass

    def stopped(self, parts, saved, measured=None):
        return parts

    def finished(self, epochs_done):
        return None

    def finish(self, parts):
        return parts


def train(cfg: Config, ctx: DistContext, checkpoint: Checkpoint = NoCheckpoint(),
          epochs: Epochs = EveryBatch(), records: Records = NoRecords()) -> Any:
    """Train per `cfg` on the initialised process group."""
    plan = batch_plan(cfg.train, ctx.env.world_size)
    splits = load_data(cfg.data, cfg.train, ctx)
    # every rank's clock starts at the same instant
    ctx.barrier()
    clock = Clock(ctx.device)
    timer = StepTimer(clock, enabled=cfg.timing.enabled)
    # train.cuda_graph: DDP built on the side stream it is captured on
    with graph_stream(cfg.train, ctx.device):
        parts = build_parts(cfg, ctx, clock)
    model, syncer, optimizer = parts
    # the synchroniser's preflight, the CPU threads, train.compile
    compile_s = prepare_steps(cfg.train, ctx, syncer, optimizer, splits, plan.micro)
    # epoch 0 step 0, or where the newest checkpoint stands
    start = checkpoint.load(parts)
    if start.epoch >= cfg.train.epochs:
        # collective: every rank has run the same steps
        syncer.close()
        return records.finished(start.epoch)
    epochs.start(clock, timer, parts, start)
    records.start(start, timer, parts, splits, compile_s)
    # None: the steps run eagerly
    graph = graphed_steps(cfg.train, syncer, optimizer, plan.per_rank)
    for epoch in range(start.epoch, cfg.train.epochs):
        batches = epochs.batches(epoch, splits.train)
        if graph is None:
            loss_sum, correct = run_steps(syncer, optimizer, batches, timer, plan.micro_batch)
        else:
            loss_sum, correct = graph.run_steps(batches, timer)
        measured, stop = epochs.end(batches, loss_sum, correct)
        if stop:
            # every rank agreed to stop mid-epoch: saved where it stands
            saved = checkpoint.save_stop(stop, epoch, measured)
            return records.stopped(parts, saved, measured)
        # fsdp2: its weights gathered once, not per batch
        with syncer.evaluation():
            test = evaluate(model, splits, cfg.train.eval_batch_size, ctx)
        # the checkpoint, then the record: it never outlives its state
        checkpoint.save(epoch + 1)
        records.epoch(measured, test)
        # the failure hook, then a stop every rank agreed on
        stop = epochs.between(epoch + 1)
        if stop:
            return records.stopped(parts, checkpoint.save_stop(stop, epoch + 1))
    # collective: every rank has run the same steps
    syncer.close()
    return records.finish(parts)


def load_data(
    data: DataConfig, train: TrainConfig, ctx: DistContext
) -> Splits:
    """MNIST on disk (one rank per shared root fetches it, the
    others wait), then this rank's shard of the training set and
    its share of the test set, on its device."""
    prepare_mnist(data.root, list(data.mirrors), ctx, data.node_local)
    return build_splits(data, train, ctx.env, ctx.device)


def build_parts(cfg: Config, ctx: DistContext, clock: Clock) -> Parts:
    """The model, its synchroniser and the optimiser, on this rank's
    device. The model is seeded first, so every rank starts from the
    same weights. The benchmarks build theirs here too."""
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model).to(ctx.device)
    syncer = build_sync(
        cfg.sync,
        model,
        ctx.device,
        ctx.env.world_size,
        clock=clock,
        timing=cfg.timing.enabled,
    )
    # the optimiser steps what the sync says this rank owns: every
    # parameter, or (zero1) its shard
    optimizer = syncer.make_optimizer(
        lambda params: build_optimizer(cfg.optim, params, cfg.train.lr)
    )
    return Parts(model, syncer, optimizer)
