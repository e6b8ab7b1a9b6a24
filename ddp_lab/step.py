"""One epoch's training steps, the heart of data-parallel training, on
every rank:

    for x, y in batches:                      # this rank's shard of each batch
        out = model(x)                        # forward
        loss = cross_entropy(out, y)
        loss.backward()                       # backward: this rank's gradients
        syncer.sync()                         # every rank's .grad becomes the average
        syncer.step(optimizer)                # the same update on every rank

each phase timed (`timer.phase`); `accumulate` splits a batch into
micro-batches whose gradients add up before the one sync; `evaluate`
scores the test set, each rank its share. `train.py` runs these epoch
after epoch.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Iterable

import torch
import torch.nn.functional as F

from .data import Splits
from .world.distributed import DistContext
from .timing import StepTimer


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, splits: Splits, batch_size: int, ctx: DistContext
) -> tuple[float, float]:
    """Global test loss and accuracy: every rank scores its disjoint
    share, then a sum."""
    device = ctx.device
    was_training = model.training
    model.eval()
    loss = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    for i in range(0, len(splits.test_x), batch_size):
        x, y = (
            splits.test_x[i : i + batch_size],
            splits.test_y[i : i + batch_size],
        )
        out = model(x)
        loss += F.cross_entropy(out, y, reduction="sum").double()
        correct += (out.argmax(1) == y).sum()
    model.train(was_training)
    total_loss, total_correct, total = ctx.reduce_floats(
        [loss.item(), float(correct.item()), float(len(splits.test_x))]
    )
    return total_loss / total, total_correct / total


def run_steps(
    syncer,
    optimizer: torch.optim.Optimizer,
    batches: Iterable,
    timer: StepTimer,
    micro_batch: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The training steps of one epoch, each phase timed: the summed
    loss and the correct predictions, on the device. `batches` gives each
    step's (x, y); the trainer's (`EpochBatches`, ddp_lab/rank/epochs.py)
    also times the data phase, counts the steps and agrees on a stop.
    `micro_batch` > 0: a larger batch accumulates its gradient over
    micro-batches (`accumulate`) and is synchronised once, after the
    last."""
    # the train loss and accuracy, on the device: summed once, at the end
    tally = EpochTally(syncer.device)
    for x, y in batches:
        if micro_batch and len(y) > micro_batch:
            loss, out = accumulate(
                syncer, optimizer, x, y, micro_batch, timer
            )
        else:
            with timer.phase("forward"):
                out = syncer.wrapped(x)
                loss = F.cross_entropy(out, y)
            with timer.phase("backward"):
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
        with timer.phase("sync"):
            # every rank's .grad becomes the average
            syncer.sync()
        with timer.phase("optim"):
            syncer.step(optimizer)
        timer.end_step()
        # copies on the device: nothing waits for it
        tally.add(loss, out, y)
    return tally.sums()


class EpochTally:
    """The epoch's train loss and correct predictions (train accuracy,
    as the notebook's check), kept on the device: each step's mean loss,
    outputs and labels are copied into buffers, and scored and summed
    once, at the end (`sums`). No tensor is kept per step and nothing is
    computed per step, only copied: keeping each step's output cost a
    forked rank's first two epochs at 2 threads 11%, scoring each step
    5%, and an argmax per step a fifth of the tally's own time
    (docs/performance.md)."""

    def __init__(self, device: torch.device, steps: int = 1024, samples: int = 65536):
        self.device = device
        self.steps, self.samples = 0, 0
        self.sizes: list[int] = []
        self.losses = torch.empty(steps, dtype=torch.float64, device=device)
        self.labels = torch.empty(samples, dtype=torch.int64, device=device)
        # [samples, classes], made at the first step (its classes)
        self.outputs: torch.Tensor | None = None

    def add(self, loss: torch.Tensor, out: torch.Tensor, y: torch.Tensor) -> None:
        """A step: its mean loss, its outputs, its labels."""
        i, lo, hi = self.steps, self.samples, self.samples + len(y)
        if self.outputs is None:
            self.outputs = out.new_empty(len(self.labels), out.shape[1])
        if i == len(self.losses):
            self.losses = _grown(self.losses, i + 1)
        if hi > len(self.labels):
            self.outputs, self.labels = _grown(self.outputs, hi), _grown(self.labels, hi)
        self.losses[i] = loss.detach()
        self.outputs[lo:hi] = out.detach()
        self.labels[lo:hi] = y
        self.sizes.append(len(y))
        self.steps, self.samples = i + 1, hi

    def sums(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The summed loss (each step's mean loss times its samples, in
        float64) and the correct predictions."""
        n, m = self.steps, self.samples
        samples = torch.tensor(self.sizes, dtype=torch.float64, device=self.device)
        loss_sum = (self.losses[:n] * samples).sum()
        if self.outputs is None:
            return loss_sum, torch.zeros((), dtype=torch.int64, device=self.device)
        return loss_sum, (self.outputs[:m].argmax(1) == self.labels[:m]).sum()


def _grown(buffer: torch.Tensor, at_least: int) -> torch.Tensor:
    """`buffer` with room for `at_least` entries: twice as long, or more."""
    grown = buffer.new_empty(max(2 * len(buffer), at_least), *buffer.shape[1:])
    grown[: len(buffer)].copy_(buffer)
    return grown


def accumulate(
    syncer,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    micro_batch: int,
    timer: StepTimer,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward of one batch in micro-batches of
    `micro_batch` samples, their gradients summed in .grad; returns the
    batch's mean loss (detached) and its outputs (detached). Each
    micro-batch's mean loss is weighted by its share of the batch, so
    the accumulated gradient is the whole batch's mean gradient. No
    synchroniser communicates before the step's `sync()`; DDP, which
    all-reduces from inside backward, is held back by `syncer.no_sync()`
    on every micro-batch but the last. The step's forward and backward
    phases are the sums of the micro-batches' ones."""
    xs, ys = x.split(micro_batch), y.split(micro_batch)
    total = torch.zeros((), device=y.device)
    outs = []
    for i, (xm, ym) in enumerate(zip(xs, ys)):
        with syncer.no_sync() if i < len(ys) - 1 else nullcontext():
            with timer.phase("forward"):
                out = syncer.wrapped(xm)
                loss = F.cross_entropy(out, ym) * (len(ym) / len(y))
            with timer.phase("backward"):
                if i == 0:
                    optimizer.zero_grad(set_to_none=True)
                loss.backward()
        total += loss.detach()
        outs.append(out.detach())
    return total, torch.cat(outs)
