"""The loop every rank runs: the course notebook's loop plus a sync.

    data -> model -> synchroniser -> optimiser
    each epoch: run_steps (step.py), then evaluate

What a real run adds (resume, stop, checkpoints, records, profiler,
CUDA graphs, compile) is `machinery`, handed in from outside by the
worker (ddp_lab/rank/machinery.py). `Machinery` below is all the loop
asks of it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable, Iterable, NamedTuple, Protocol

import torch

from .config import Config, DataConfig, TrainConfig, batch_plan
from .data import Splits, build_splits
from .data_fetch import prepare_mnist
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


class Machinery(Protocol):
    """The run around the loop, one call each (rank/machinery.py)."""

    timer: StepTimer  # stamps the phases of each step

    def building(self) -> AbstractContextManager:
        """Where the synchroniser is built."""

    def start(
        self, clock: Clock, parts: Parts, splits: Splits, steps: Callable
    ) -> tuple[int, Callable]:
        """The epoch to start from, and what runs the steps."""

    def batches(self, epoch: int, shard: Any) -> Iterable:
        """Epoch `epoch`'s batches of this rank's shard."""

    def steps_done(
        self, batches: Iterable, loss_sum: torch.Tensor, correct: torch.Tensor
    ) -> None:
        """The epoch's steps ended (or a stop ends the run here)."""

    def epoch_done(self, test: tuple[float, float]) -> None:
        """The epoch ended with this test loss and accuracy."""

    def finish(self, parts: Parts) -> Any:
        """The run's result."""


def train(cfg: Config, ctx: DistContext, machinery: Machinery) -> Any:
    """Train per `cfg` on the initialised process group."""
    plan = batch_plan(cfg.train, ctx.env.world_size)
    splits = load_data(cfg.data, cfg.train, ctx)
    # every rank's clock starts at the same instant
    ctx.barrier()
    clock = Clock(ctx.device)
    with machinery.building():
        parts = build_parts(cfg, ctx, clock)
    model, syncer, optimizer = parts
    first, steps = machinery.start(clock, parts, splits, run_steps)
    for epoch in range(first, cfg.train.epochs):
        batches = machinery.batches(epoch, splits.train)
        loss_sum, correct = steps(
            syncer, optimizer, batches, machinery.timer, plan.micro_batch
        )
        machinery.steps_done(batches, loss_sum, correct)
        # fsdp2: its weights gathered once, not per batch
        with syncer.evaluation():
            test = evaluate(model, splits, cfg.train.eval_batch_size, ctx)
        machinery.epoch_done(test)
    # collective: every rank has run the same steps
    syncer.close()
    return machinery.finish(parts)


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
