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
    # each step's, on the device: scored and summed once, at the end
    losses, outs, labels = [], [], []
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
        # references, no kernel: nothing waits for the device
        losses.append(loss.detach())
        outs.append(out.detach())
        labels.append(y)
    return epoch_sums(losses, outs, labels, syncer.device)


def epoch_sums(
    losses: list, outs: list, labels: list, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The epoch's summed loss (each step's mean loss times its samples,
    in float64) and its correct predictions (train accuracy, as the
    notebook's check), from the steps' tensors: a few kernels an epoch
    instead of five a step (three of them cost a 2-thread step 5%,
    docs/performance.md)."""
    if not losses:
        return (
            torch.zeros((), dtype=torch.float64, device=device),
            torch.zeros((), dtype=torch.int64, device=device),
        )
    samples = torch.tensor([len(y) for y in labels], dtype=torch.float64,
                           device=device)
    correct = (torch.cat(outs).argmax(1) == torch.cat(labels)).sum()
    return (torch.stack(losses).double() * samples).sum(), correct


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
