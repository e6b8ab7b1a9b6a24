"""The training loop, on every rank: steps, gradient synchronisation, optimiser, evaluation,
checkpoints.

`train` reads as the course notebook's loop plus the sync: data, then the seeded model,
its synchroniser and the optimiser (`build_parts`), then per epoch the steps (`run_steps`:
data, forward, backward, sync, optimiser step), evaluation, a checkpoint and the epoch's
record. What a real run needs besides sits behind one call each:

- `Checkpointer` (ddp_lab/run/checkpointer.py): where the run starts (resume, restarts and
  requeues agreed on by every rank), the checkpoint after each epoch, a graceful stop's;
- `EpochMeter` (below): the barriers and clocks around each epoch's steps, the step timer,
  the injected delay; it hands back one `MeasuredEpoch`;
- `Telemetry` (ddp_lab/run/telemetry.py): the run's records (metrics.jsonl, summary.json,
  TensorBoard, the console line) from the measured epochs;
- `stop_control` (ddp_lab/run/stop.py): the agreement on stopping at the same step.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

import torch
import torch.nn.functional as F

from .run import progress
from .run.checkpointer import Checkpointer
from .config import Config, batch_plan
from .run.files import read_json_or_empty
from .data import Splits, build_splits, prepare_mnist
from .run.delay import ComputeDelay
from .distributed import DistContext
from .run.epoch import MeasuredEpoch, Position
from .models import build_model, build_optimizer
from .run.records import RunSummary
from .run.stop import StopControl, StopInfo, stop_control
from .sync import Synchroniser, build_sync
from .run.telemetry import Telemetry
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
              timer: StepTimer, stopper: Optional[StopControl] = None, micro_batch: int = 0,
              delay: Optional[Callable[[], None]] = None
              ) -> tuple[torch.Tensor, int, Optional[StopInfo]]:
    """The training steps of one epoch, each phase timed: (summed loss on the device,
    samples, None), or with the StopInfo all ranks agreed on when they stopped early.
    `micro_batch` > 0: a batch larger than that accumulates its gradient over micro-batches
    (`accumulate`) and is synchronised once, after the last. `delay` (debug.slow_ms /
    jitter_ms, ddp_lab/run/delay.py) runs at the start of every step's forward phase."""
    loss_sum = torch.zeros((), dtype=torch.float64, device=syncer.device)
    samples = 0
    for _ in steps:
        with timer.phase("data"):
            x, y = next(batches)
        if micro_batch and len(y) > micro_batch:
            loss = accumulate(syncer, optimizer, x, y, micro_batch, timer, delay)
        else:
            with timer.phase("forward"):
                if delay is not None:
                    delay()  # an injected straggler: part of this rank's compute
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
        if stopper is not None:
            info = stopper.step()
            if info is not None:
                return loss_sum, samples, info
    return loss_sum, samples, None


def accumulate(syncer, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               micro_batch: int, timer: StepTimer,
               delay: Optional[Callable[[], None]] = None) -> torch.Tensor:
    """Forward and backward of one batch in micro-batches of `micro_batch` samples, their
    gradients summed in .grad; returns the batch's mean loss (detached). Each micro-batch's
    mean loss is weighted by its share of the batch, so the accumulated gradient is the
    whole batch's mean gradient. No synchroniser communicates before the step's `sync()`;
    DDP, which all-reduces from inside backward, is held back by `syncer.no_sync()` on
    every micro-batch but the last. The step's forward and backward phases are the sums
    of the micro-batches' ones; `delay` runs once, in the first micro-batch's forward."""
    xs, ys = x.split(micro_batch), y.split(micro_batch)
    total = torch.zeros((), device=y.device)
    for i, (xm, ym) in enumerate(zip(xs, ys)):
        with syncer.no_sync() if i < len(ys) - 1 else nullcontext():
            with timer.phase("forward"):
                if delay is not None and i == 0:
                    delay()
                loss = F.cross_entropy(syncer.model(xm), ym) * (len(ym) / len(y))
            with timer.phase("backward"):
                if i == 0:
                    optimizer.zero_grad(set_to_none=True)
                loss.backward()
        total += loss.detach()
    return total


def compile_model(syncer, splits: Splits, batch_size: int) -> float:
    """train.compile: torch.compile the model the step calls (DDP's wrapper included: dynamo
    splits its graph at DDP's buckets) and compile it now, so that no epoch holds the
    compilation: one forward and backward at the batch size, then one at another size (the
    epoch's short last batch would otherwise compile a dynamic-shape graph mid-epoch).
    Gradients are dropped; weights, optimiser and RNG are untouched. Returns the seconds."""
    t0 = time.perf_counter()
    syncer.model = torch.compile(syncer.model)
    n = min(batch_size, len(splits.test_x))
    sizes = [n, n - 1] if n > 2 else [n]
    devices = [syncer.device] if syncer.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        for size in sizes:
            F.cross_entropy(syncer.model(splits.test_x[:size]), splits.test_y[:size]).backward()
            syncer.sync()  # sync.overlap: the buckets backward started are waited for
    syncer.module.zero_grad(set_to_none=True)
    syncer.take_comm()  # DDP's warm-up all-reduces are no epoch's
    if syncer.device.type == "cuda":
        torch.cuda.synchronize(syncer.device)
    seconds = time.perf_counter() - t0
    log.info("train.compile: model compiled in %.1f s (outside every epoch)", seconds)
    return seconds


def train(cfg: Config, ctx: DistContext, run_dir: Path) -> RunSummary:
    """Train per `cfg` on the initialised process group; return the run's summary. The
    course notebook's loop plus the sync; the rest is one call each (module docstring)."""
    plan = batch_plan(cfg.train, ctx.env.world_size)  # per-rank batch, micro-batches
    micro = plan.micro if plan.accumulation > 1 else 0
    prepare_mnist(cfg.data.root, list(cfg.data.mirrors), ctx, cfg.data.node_local)
    splits = build_splits(cfg.data, cfg.train, ctx.env, ctx.device)  # this rank's shard
    ctx.barrier()  # load-bearing: every rank's clock starts at the same instant (trace)
    clock = Clock(ctx.device)
    module, syncer, optimizer = build_parts(cfg, ctx, clock)  # seeded: the same on every rank
    compile_s = preflight_and_compile(cfg, syncer, splits, micro or plan.per_rank)
    ckpt = Checkpointer(cfg, ctx, run_dir / "checkpoints", module, optimizer, syncer, plan)
    start = ckpt.load()  # epoch 0 step 0, or where the newest checkpoint stands
    if start.epoch >= cfg.train.epochs:  # a finished run, started again: leave it as it is
        return finished(run_dir, start.epoch)
    meter = EpochMeter(cfg, ctx, clock, syncer, ckpt)  # each epoch's clock, timer, barriers
    telemetry = Telemetry(cfg, ctx, run_dir, steps_per_epoch(cfg, splits), syncer.bytes_exact,
                          plan=plan, compile_s=compile_s)
    telemetry.start(start.epoch, start.step)
    with stop_control(ctx, run_dir, cfg.train) as stopper:
        for epoch in range(start.epoch, cfg.train.epochs):
            splits.train.set_epoch(epoch)  # this epoch's shuffle, the same on every rank
            skip = meter.begin(epoch, stopper)  # 0, or the steps a mid-epoch checkpoint holds
            loss_sum, samples, stop = run_steps(syncer, optimizer, splits.train.iter_from(skip),
                                                telemetry.progress(epoch, skip), meter.timer,
                                                stopper, micro, meter.delay)
            measured = meter.end(loss_sum, samples)
            if stop is not None:  # mid-epoch: save where every rank is, then leave
                return telemetry.finish(**ckpt.on_stop(stop, measured))
            measured.test = evaluate(module, splits, cfg.train.eval_batch_size, ctx)
            ckpt.save(Position(epoch + 1))  # then the record: it never outlives its state
            telemetry.epoch(measured)
            _maybe_fail_once(ctx, epoch + 1)  # DDP_LAB_FAIL_ONCE: a crash, to test restarts
            stop = stopper.check() if epoch + 1 < cfg.train.epochs else None  # eval may be long
            if stop is not None:
                return telemetry.finish(**ckpt.on_stop(stop, epochs_done=epoch + 1))
    syncer.close()  # collective: every rank has run the same steps
    return telemetry.finish()


def build_parts(cfg: Config, ctx: DistContext, clock: Clock
                ) -> tuple[torch.nn.Module, Synchroniser, torch.optim.Optimizer]:
    """The model (seeded with train.seed first: the same initial weights on every rank), its
    synchroniser and the optimiser, on this rank's device. scripts/bench_*.py build theirs
    here too (ddp_lab/bench/scaffold.py), so a benchmark times the trainer's own parts."""
    torch.manual_seed(cfg.train.seed)
    module = build_model(cfg.model).to(ctx.device)
    syncer = build_sync(cfg.sync, module, ctx.device, ctx.env.world_size, clock=clock,
                        timing=cfg.timing.enabled)
    optimizer = build_optimizer(cfg.optim, module.parameters(), cfg.train.lr)
    return module, syncer, optimizer


def preflight_and_compile(cfg: Config, syncer, splits: Splits, batch_size: int) -> Optional[float]:
    """The synchroniser's preflight on two test samples (a misconfiguration fails here, not
    mid-step), then train.compile's compilation: its seconds, None when not compiled."""
    x0, y0 = splits.test_x[:2], splits.test_y[:2]
    syncer.preflight(lambda m=syncer.module: F.cross_entropy(m(x0), y0))
    return compile_model(syncer, splits, batch_size) if cfg.train.compile else None


def steps_per_epoch(cfg: Config, splits: Splits) -> int:
    """The shard's batches, or train.max_steps_per_epoch of them."""
    n, most = len(splits.train), cfg.train.max_steps_per_epoch
    return min(n, most) if most > 0 else n


def finished(run_dir: Path, epochs: int) -> RunSummary:
    """A run that has done all its epochs, started again: its summary, left as it is."""
    log.info("the run in %s has completed its %d epochs: nothing to do", run_dir, epochs)
    return RunSummary.from_dict(read_json_or_empty(run_dir / "summary.json"))


class EpochMeter:
    """The clock around each epoch's steps, on every rank: the ranks start it together,
    the epoch ends when the slowest rank ends, and what the epoch measured comes back as
    one `MeasuredEpoch`, with the part a mid-epoch checkpoint carried. It holds the step
    timer and the injected delay (debug.*) that `run_steps` takes."""

    def __init__(self, cfg: Config, ctx: DistContext, clock: Clock, syncer,
                 ckpt: Checkpointer):
        self.cfg, self.ctx, self.clock, self.syncer, self.ckpt = cfg, ctx, clock, syncer, ckpt
        record = progress.current()  # each phase and step's end says where this rank is
        self.timer = StepTimer(clock, enabled=cfg.timing.enabled,
                               on_phase=record.phase, on_step_end=record.step_done)
        self.timer.watch_grads(syncer.module)  # compute end: each step's last gradient ready
        self.delay = ComputeDelay.from_config(cfg.debug, ctx.env.rank, cfg.train.seed)  # or None
        self.epoch, self.skip, self.t0 = 0, 0, 0.0

    def begin(self, epoch: int, stopper: StopControl) -> int:
        """Collective. Epoch `epoch` (0-based) starts; the step it starts at: 0, or in the
        epoch the run resumes in, the steps its mid-epoch checkpoint holds."""
        skip = self.ckpt.carried(epoch).step
        self.ctx.synchronize()
        self.ctx.barrier()  # load-bearing: every rank starts the clock together
        self.clock.anchor()  # the GPU is idle here: its timeline is pinned to the host clock
        stopper.restart_clock()
        progress.current().at(epoch, skip)  # where this rank is, for the others (status)
        self.epoch, self.skip, self.t0 = epoch, skip, time.perf_counter()
        return skip

    def end(self, loss_sum: torch.Tensor, samples: int) -> MeasuredEpoch:
        """Collective. The epoch's steps are done (or stopped): what this rank measured."""
        self.ctx.synchronize()  # wait for the GPU to finish the epoch's work
        busy = time.perf_counter() - self.t0  # this rank's own time, before waiting for the others
        self.ctx.barrier()  # load-bearing: the epoch ends when the slowest rank ends
        wall = time.perf_counter() - self.t0
        # the epoch's stamps and comm, taken before the checkpoint (a synchroniser may
        # communicate to bring the optimiser state to rank 0) adds to them
        steps, comm = self.timer.collect(), self.syncer.take_comm()
        return MeasuredEpoch(self.epoch + 1, steps, comm, busy, wall, loss_sum.item(), samples,
                             resumed_at_step=self.skip, carried=self.ckpt.carried(self.epoch))


def _maybe_fail_once(ctx: DistContext, epoch: int) -> None:
    """Fault injection for testing restarts: DDP_LAB_FAIL_ONCE="rank=R,epoch=E" kills rank R
    after epoch E, on the first attempt only (TORCHELASTIC_RESTART_COUNT == 0)."""
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
