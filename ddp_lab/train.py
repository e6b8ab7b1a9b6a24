"""The training loop, on every rank: steps, gradient synchronisation, optimiser, evaluation,
checkpoints. What the loop measures it hands to `ddp_lab.telemetry`, which builds and
writes the run's records (metrics.jsonl, summary.json, TensorBoard, the console line)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
import torch.nn.functional as F

from . import checkpoint
from .data import Splits, build_splits, prepare_mnist
from .distributed import DistContext
from .models import build_model, build_optimizer
from .records import RunSummary
from .sync import build_sync
from .telemetry import Telemetry
from .timing import Clock, StepTimer

log = logging.getLogger("ddp_lab")


@torch.no_grad()
def evaluate(model: torch.nn.Module, splits: Splits, batch_size: int,
             ctx: DistContext) -> tuple[float, float]:
    """Global test loss and accuracy: every rank scores its disjoint share, then a sum."""
    device = ctx.device
    was_training = model.training
    model.eval()
    loss = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    for i in range(0, len(splits.test_x), batch_size):
        x, y = splits.test_x[i:i + batch_size], splits.test_y[i:i + batch_size]
        out = model(x)
        loss += F.cross_entropy(out, y, reduction="sum").double()
        correct += (out.argmax(1) == y).sum()
    model.train(was_training)
    total_loss, total_correct, total = ctx.reduce_floats(
        [loss.item(), float(correct.item()), float(len(splits.test_x))])
    return total_loss / total, total_correct / total


def run_steps(syncer, optimizer: torch.optim.Optimizer, batches: Iterator, steps: Iterable,
              timer: StepTimer) -> tuple[torch.Tensor, int]:
    """The training steps of one epoch, each phase timed: (summed loss on the device, samples)."""
    loss_sum = torch.zeros((), dtype=torch.float64, device=syncer.device)
    samples = 0
    for _ in steps:
        with timer.phase("data"):
            x, y = next(batches)
        with timer.phase("forward"):
            loss = F.cross_entropy(syncer.model(x), y)
        with timer.phase("backward"):
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
        with timer.phase("sync"):
            syncer.sync()
        with timer.phase("optim"):
            syncer.step(optimizer)
        timer.end_step()
        loss_sum += loss.detach().double() * len(y)  # stays on the device: no sync point
        samples += len(y)
    return loss_sum, samples


def train(cfg: Any, ctx: DistContext, run_dir: Path) -> RunSummary:
    """Train per `cfg` on the initialised process group; return the run's summary."""
    env, device = ctx.env, ctx.device
    torch.manual_seed(cfg.train.seed)  # same initial weights on every rank
    prepare_mnist(cfg.data.root, list(cfg.data.mirrors), ctx, cfg.data.node_local)
    splits = build_splits(cfg.data, cfg.train, env, device)

    ctx.barrier()  # load-bearing: every rank's clock starts at the same instant (trace)
    clock = Clock(device)
    module = build_model(cfg.model).to(device)
    syncer = build_sync(cfg.sync, module, device, env.world_size, clock=clock,
                        timing=cfg.timing.enabled)
    optimizer = build_optimizer(cfg.optim, module.parameters(), cfg.train.lr)
    x0, y0 = splits.test_x[:2], splits.test_y[:2]
    syncer.preflight(lambda: F.cross_entropy(module(x0), y0))  # fails here, not mid-step
    ckpt_dir = run_dir / "checkpoints"
    start_epoch = _resume(cfg, ctx, ckpt_dir, module, optimizer)

    steps_per_epoch = len(splits.train)
    if cfg.train.max_steps_per_epoch > 0:
        steps_per_epoch = min(steps_per_epoch, cfg.train.max_steps_per_epoch)
    timer = StepTimer(clock, enabled=cfg.timing.enabled)
    telemetry = Telemetry(cfg, ctx, run_dir, steps_per_epoch, syncer.bytes_exact)
    telemetry.start(start_epoch)
    for epoch in range(start_epoch, cfg.train.epochs):
        splits.train.set_epoch(epoch)
        ctx.synchronize()
        ctx.barrier()  # load-bearing: every rank starts the clock together
        clock.anchor()  # the GPU is idle here: its timeline is pinned to the host clock
        t0 = time.perf_counter()
        steps = telemetry.progress(range(steps_per_epoch), epoch)
        loss_sum, samples = run_steps(syncer, optimizer, iter(splits.train), steps, timer)
        ctx.synchronize()  # wait for the GPU to finish the epoch's work
        busy = time.perf_counter() - t0  # this rank's own time, before waiting for the others
        ctx.barrier()  # load-bearing: the epoch ends when the slowest rank ends
        wall = time.perf_counter() - t0
        # the epoch's stamps and comm, taken before the checkpoint (a synchroniser may
        # communicate to bring the optimiser state to rank 0) adds to them
        steps_t, comm = timer.collect(), syncer.take_comm()
        test = evaluate(module, splits, cfg.train.eval_batch_size, ctx)
        # checkpoint first, then the metrics line: a record never outlives its state
        _save_checkpoint(cfg, ctx, ckpt_dir, epoch + 1, module, optimizer, syncer)
        telemetry.epoch(epoch + 1, steps_t, comm, busy, wall, loss_sum.item(), samples, test)
        _maybe_fail_once(ctx, epoch + 1)

    syncer.close()  # collective: every rank has run the same steps
    nothing_trained = start_epoch >= cfg.train.epochs  # resumed a run that had finished
    final = evaluate(module, splits, cfg.train.eval_batch_size, ctx) if nothing_trained else None
    return telemetry.finish(final)


def _resume(cfg: Any, ctx: DistContext, ckpt_dir: Path, module: torch.nn.Module,
            optimizer: torch.optim.Optimizer) -> int:
    """Load the newest checkpoint when resuming (asked, or after a restart); the epochs done."""
    env = ctx.env
    # TORCHELASTIC_RESTART_COUNT counts restarts of *this node's* worker group only
    # (pytorch/pytorch#108158): after a restart every rank must resume, so agree on it.
    restarted = ctx.any_rank(env.restart_count > 0)
    if not (cfg.train.resume or restarted):
        return 0
    path = checkpoint.latest(ckpt_dir)
    if path is None and cfg.train.resume:
        raise FileNotFoundError(f"train.resume=true but {ckpt_dir} holds no checkpoint: "
                                "point run.dir at a run that completed an epoch")
    if path is None:
        return 0
    state = checkpoint.load(path, ctx.device)
    module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if state.get("world_size") != env.world_size:
        log.warning("checkpoint was written by %s ranks, resuming on %d: the data order "
                    "differs from an uninterrupted run", state.get("world_size"), env.world_size)
    log.info("resumed from %s (epoch %d done)", path.name, state["epoch"])
    return state["epoch"]


def _save_checkpoint(cfg: Any, ctx: DistContext, ckpt_dir: Path, epoch: int,
                     module: torch.nn.Module, optimizer: torch.optim.Optimizer, syncer) -> None:
    """Collective (the synchroniser may gather the optimiser state); rank 0 writes."""
    if not cfg.train.checkpoint:
        return
    opt_state = syncer.optimizer_state(optimizer)
    if ctx.env.is_main:  # one copy of the (identical) model, in the shared run folder
        checkpoint.save_epoch(ckpt_dir, epoch, {
            "model": module.state_dict(), "optimizer": opt_state,
            "world_size": ctx.env.world_size, "sync": cfg.sync.name})


def _maybe_fail_once(ctx: DistContext, epoch: int) -> None:
    """Fault injection for testing restarts: DDP_LAB_FAIL_ONCE="rank=R,epoch=E" kills rank R
    after epoch E, on the first attempt only (TORCHELASTIC_RESTART_COUNT == 0)."""
    import os

    spec = os.environ.get("DDP_LAB_FAIL_ONCE")
    if not spec or ctx.env.restart_count > 0:
        return
    try:
        want = {k.strip(): int(v) for k, v in (kv.split("=") for kv in spec.split(","))}
        rank, at = want["rank"], want["epoch"]
    except (ValueError, KeyError):
        raise ValueError(f"DDP_LAB_FAIL_ONCE={spec!r}: expected 'rank=R,epoch=E'") from None
    if epoch != at:
        return
    ctx.barrier()  # load-bearing: rank 0 has written this epoch's checkpoint before anyone dies
    if ctx.env.rank == rank:
        log.error("DDP_LAB_FAIL_ONCE: rank %d exits after epoch %d (first attempt only)", rank, epoch)
        logging.shutdown()
        os._exit(17)  # a crash, not an exception: no clean-up, as a killed process
