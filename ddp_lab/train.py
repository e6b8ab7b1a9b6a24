"""The training run, on every rank: data, model, synchroniser, optimiser, then epoch after
epoch the steps (ddp_lab/step.py), evaluation, a checkpoint and the epoch's record.

`train` reads as the course notebook's loop plus the sync: data, then the seeded model,
its synchroniser and the optimiser (`build_parts`), then per epoch `run_steps` (data,
forward, backward, sync, optimiser step), evaluation, a checkpoint and the epoch's
record. What a real run needs besides sits behind one call each:

- `Checkpointer` (ddp_lab/run/checkpointer.py): where the run starts (resume, restarts and
  requeues agreed on by every rank), the checkpoint after each epoch, a graceful stop's;
- `EpochMeter` (ddp_lab/run/epoch.py): the barriers and clocks around each epoch's steps,
  the step timer, the injected delay; it hands back one `MeasuredEpoch`;
- `Telemetry` (ddp_lab/run/telemetry.py): the run's records (metrics.jsonl, summary.json,
  TensorBoard, the console line) from the measured epochs, and TensorBoard's per-step
  points as the steps end (it listens to the meter's step timer);
- `stop_control` (ddp_lab/run/stop.py): the agreement on stopping at the same step.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from .config import Config, batch_plan
from .data import Splits, build_splits, prepare_mnist
from .distributed import DistContext
from .models import build_model, build_optimizer
from .run.checkpointer import Checkpointer
from .run.compile import preflight_and_compile
from .run.delay import fail_once
from .run.epoch import EpochMeter, Position
from .run.files import read_json_or_empty
from .run.records import RunSummary
from .run.stop import stop_control
from .run.telemetry import Telemetry
from .step import evaluate, run_steps
from .sync import Synchroniser, build_sync
from .timing import Clock

log = logging.getLogger("ddp_lab")


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
    compile_s = preflight_and_compile(cfg.train, syncer, splits, micro or plan.per_rank)
    ckpt = Checkpointer(cfg, ctx, run_dir / "checkpoints", module, optimizer, syncer, plan)
    start = ckpt.load()  # epoch 0 step 0, or where the newest checkpoint stands
    if start.epoch >= cfg.train.epochs:  # a finished run, started again: leave it as it is
        return finished(run_dir, start.epoch)
    meter = EpochMeter(cfg, ctx, clock, syncer, ckpt.carried)  # each epoch's clock, timer, barriers
    telemetry = Telemetry(cfg, ctx, run_dir, steps_per_epoch(cfg, splits), syncer.bytes_exact,
                          plan=plan, compile_s=compile_s, meter=meter)
    telemetry.start(start.epoch, start.step)
    with stop_control(ctx, run_dir, cfg.train) as stopper:
        for epoch in range(start.epoch, cfg.train.epochs):
            splits.train.set_epoch(epoch)  # this epoch's shuffle, the same on every rank
            skip = meter.begin(epoch, stopper)  # 0, or the steps a mid-epoch checkpoint holds
            loss_sum, correct, samples, stop = run_steps(
                syncer, optimizer, splits.train.iter_from(skip), telemetry.progress(epoch, skip),
                meter.timer, stopper, micro, meter.delay)
            measured = meter.end(loss_sum, correct, samples)
            if stop is not None:  # mid-epoch: save where every rank is, then leave
                return telemetry.finish(**ckpt.on_stop(stop, measured),
                                        memory=syncer.memory(optimizer))
            measured.test = evaluate(module, splits, cfg.train.eval_batch_size, ctx)
            ckpt.save(Position(epoch + 1))  # then the record: it never outlives its state
            telemetry.epoch(measured)
            fail_once(ctx, epoch + 1)  # DDP_LAB_FAIL_ONCE: a crash, to test restarts
            stop = stopper.check() if epoch + 1 < cfg.train.epochs else None  # eval may be long
            if stop is not None:
                return telemetry.finish(**ckpt.on_stop(stop, epochs_done=epoch + 1),
                                        memory=syncer.memory(optimizer))
    syncer.close()  # collective: every rank has run the same steps
    return telemetry.finish(memory=syncer.memory(optimizer))  # bytes held per rank


def build_parts(cfg: Config, ctx: DistContext, clock: Clock
                ) -> tuple[torch.nn.Module, Synchroniser, torch.optim.Optimizer]:
    """The model (seeded with train.seed first: the same initial weights on every rank), its
    synchroniser and the optimiser, on this rank's device. The benchmarks
    (`python -m ddp_lab.bench.suite`) build theirs here too (ddp_lab/bench/scaffold.py), so
    a benchmark times the trainer's own parts."""
    torch.manual_seed(cfg.train.seed)
    module = build_model(cfg.model).to(ctx.device)
    syncer = build_sync(cfg.sync, module, ctx.device, ctx.env.world_size, clock=clock,
                        timing=cfg.timing.enabled)
    # over what the sync says this rank steps: every parameter, or (zero1) its shard
    optimizer = build_optimizer(cfg.optim, syncer.optimizer_params(), cfg.train.lr)
    return module, syncer, optimizer


def steps_per_epoch(cfg: Config, splits: Splits) -> int:
    """The shard's batches, or train.max_steps_per_epoch of them."""
    n, most = len(splits.train), cfg.train.max_steps_per_epoch
    return min(n, most) if most > 0 else n


def finished(run_dir: Path, epochs: int) -> RunSummary:
    """A run that has done all its epochs, started again: its summary, left as it is."""
    log.info("the run in %s has completed its %d epochs: nothing to do", run_dir, epochs)
    return RunSummary.from_dict(read_json_or_empty(run_dir / "summary.json"))
