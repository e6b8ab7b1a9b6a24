"""The training loop, on every rank: steps, gradient synchronisation, optimiser, evaluation,
checkpoints. What the loop measures it hands to `ddp_lab.telemetry`, which builds and
writes the run's records (metrics.jsonl, summary.json, TensorBoard, the console line)."""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
import torch.nn.functional as F

from . import checkpoint, progress
from .config import BatchPlan, batch_plan
from .files import read_json_or_empty
from .data import Splits, build_splits, prepare_mnist
from .delay import ComputeDelay
from .distributed import DistContext
from .models import build_model, build_optimizer
from .records import RunSummary
from .rundir import resume_mode
from .stop import StopControl, StopInfo, clear_stop_file
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
              timer: StepTimer, stopper: Optional[StopControl] = None, micro_batch: int = 0,
              delay: Optional[Callable[[], None]] = None
              ) -> tuple[torch.Tensor, int, Optional[StopInfo]]:
    """The training steps of one epoch, each phase timed: (summed loss on the device,
    samples, None), or with the StopInfo all ranks agreed on when they stopped early.
    `micro_batch` > 0: a batch larger than that accumulates its gradient over micro-batches
    (`accumulate`) and is synchronised once, after the last. `delay` (debug.slow_ms /
    jitter_ms, ddp_lab/delay.py) runs at the start of every step's forward phase."""
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


def train(cfg: Any, ctx: DistContext, run_dir: Path) -> RunSummary:
    """Train per `cfg` on the initialised process group; return the run's summary."""
    env, device = ctx.env, ctx.device
    plan = batch_plan(cfg.train, env.world_size)  # per-rank batch, micro-steps (or the fix)
    micro = plan.micro if plan.accumulation > 1 else 0
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
    syncer.preflight(lambda m=module: F.cross_entropy(m(x0), y0))  # fails here, not mid-step
    compile_s = compile_model(syncer, splits, micro or plan.per_rank) if cfg.train.compile else None
    ckpt_dir = run_dir / "checkpoints"
    pos = _resume(cfg, ctx, ckpt_dir, module, optimizer, plan)

    steps_per_epoch = len(splits.train)
    if cfg.train.max_steps_per_epoch > 0:
        steps_per_epoch = min(steps_per_epoch, cfg.train.max_steps_per_epoch)
    timer = StepTimer(clock, enabled=cfg.timing.enabled)
    delay = ComputeDelay.from_config(cfg.debug, env.rank, cfg.train.seed)  # None: none injected
    timer.watch_grads(module)  # compute end: each step's last gradient ready (timing.py)
    if pos.epoch >= cfg.train.epochs:  # a finished run, started again: leave it as it is
        log.info("the run in %s has completed its %d epochs: nothing to do", run_dir, pos.epoch)
        return RunSummary.from_dict(read_json_or_empty(run_dir / "summary.json"))
    telemetry = Telemetry(cfg, ctx, run_dir, steps_per_epoch, syncer.bytes_exact, plan=plan,
                          compile_s=compile_s)
    telemetry.start(pos.epoch, pos.step)
    stopper = StopControl(ctx, run_dir, cfg.train.stop_signal, cfg.train.stop_check_s)
    if env.is_main:
        clear_stop_file(run_dir)  # a request the previous allocation acted on is spent
    ctx.barrier()  # load-bearing: no rank checks for a stop before the old request is gone
    try:
        for epoch in range(pos.epoch, cfg.train.epochs):
            skip = pos.step if epoch == pos.epoch else 0
            splits.train.set_epoch(epoch)
            ctx.synchronize()
            ctx.barrier()  # load-bearing: every rank starts the clock together
            clock.anchor()  # the GPU is idle here: its timeline is pinned to the host clock
            stopper.restart_clock()
            progress.current().at(epoch, skip)  # where this rank is, for the others (status)
            t0 = time.perf_counter()
            steps = telemetry.progress(range(skip, steps_per_epoch), epoch)
            loss_sum, samples, stop = run_steps(syncer, optimizer, splits.train.iter_from(skip),
                                                steps, timer, stopper, micro, delay)
            ctx.synchronize()  # wait for the GPU to finish the epoch's work
            busy = time.perf_counter() - t0  # this rank's own time, before waiting for the others
            ctx.barrier()  # load-bearing: the epoch ends when the slowest rank ends
            wall = time.perf_counter() - t0
            carried = pos if skip else Position()
            if skip and not env.is_main:  # the partial epoch's global sums ride on rank 0
                carried = Position(pos.epoch, pos.step, 0.0, 0, pos.busy_s, pos.wall_s)
            if stop is not None:  # mid-epoch: save where every rank is, then leave
                timer.collect(), syncer.take_comm()
                done = skip - (-samples // plan.per_rank)  # the shard's last batch may be short
                # the loss and samples so far, summed over ranks (rank 0 carries them on)
                g_loss, g_samples = ctx.reduce_floats([loss_sum.item(), float(samples)])
                here = Position(epoch, done, carried.loss_sum + g_loss,
                                carried.samples + int(g_samples), carried.busy_s + busy,
                                carried.wall_s + wall)
                _save_checkpoint(cfg, ctx, ckpt_dir, here, module, optimizer, syncer)
                return telemetry.finish(status=stop.status, position=(here.epoch, here.step),
                                        stop_reason=stop.reason)
            # the epoch's stamps and comm, taken before the checkpoint (a synchroniser may
            # communicate to bring the optimiser state to rank 0) adds to them
            steps_t, comm = timer.collect(), syncer.take_comm()
            test = evaluate(module, splits, cfg.train.eval_batch_size, ctx)
            # checkpoint first, then the metrics line: a record never outlives its state
            _save_checkpoint(cfg, ctx, ckpt_dir, Position(epoch + 1), module, optimizer, syncer)
            telemetry.epoch(epoch + 1, steps_t, comm, carried.busy_s + busy,
                            carried.wall_s + wall, carried.loss_sum + loss_sum.item(),
                            carried.samples + samples, test, resumed_at_step=skip)
            _maybe_fail_once(ctx, epoch + 1)
            if epoch + 1 < cfg.train.epochs:
                stop = stopper.check()  # one more agreement per epoch: eval may be long
                if stop is not None:
                    if not cfg.train.checkpoint:  # the only way to continue it
                        _save_checkpoint(cfg, ctx, ckpt_dir, Position(epoch + 1), module,
                                         optimizer, syncer, force=True)
                    return telemetry.finish(status=stop.status, position=(epoch + 1, 0),
                                            stop_reason=stop.reason)
    finally:
        stopper.restore()

    syncer.close()  # collective: every rank has run the same steps
    return telemetry.finish()


def _resume(cfg: Any, ctx: DistContext, ckpt_dir: Path, module: torch.nn.Module,
            optimizer: torch.optim.Optimizer, plan: BatchPlan) -> Position:
    """Load the newest checkpoint when continuing (train.resume auto/true, or a restart of
    this job); the position it holds. Later checkpoints of an older timeline go."""
    env = ctx.env
    mode = resume_mode(cfg.train.resume)
    # TORCHELASTIC_RESTART_COUNT counts restarts of *this node's* worker group only
    # (pytorch/pytorch#108158): after a restart every rank must resume, so agree on it.
    restarted = ctx.any_rank(env.restart_count > 0 or requeued())
    if mode == "false" and not restarted:
        return Position()
    path = checkpoint.latest(ckpt_dir)
    if path is None and mode == "true":
        raise FileNotFoundError(f"train.resume=true but {ckpt_dir} holds no checkpoint: "
                                "point run.dir at a run that completed an epoch")
    if path is None:
        return Position()
    state = checkpoint.load(path, ctx.device)
    module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if state.get("world_size") != env.world_size and plan.scaling != "strong":
        # (strong scaling: every world size trains on the same samples at every step)
        log.warning("checkpoint was written by %s ranks, resuming on %d: the data order "
                    "differs from an uninterrupted run", state.get("world_size"), env.world_size)
    if "rng" in state:
        _set_rng(state["rng"])
    pos = Position(state["epoch"], state.get("step", 0), **state.get("partial", {}))
    ctx.barrier()  # load-bearing: every rank has read the checkpoint before rank 0 prunes
    if env.is_main:
        checkpoint.drop_after(ckpt_dir, (pos.epoch, pos.step))
    log.info("resumed from %s (epoch %d done%s)", path.name, pos.epoch,
             f", {pos.step} steps into the next" if pos.step else "")
    return pos


def requeued() -> bool:
    """This job is a scheduler's second (or later) start of the same run."""
    import os

    return int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0


def _rng_state() -> dict:
    import random

    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng(state: dict) -> None:
    import random

    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def _save_checkpoint(cfg: Any, ctx: DistContext, ckpt_dir: Path, pos: Position,
                     module: torch.nn.Module, optimizer: torch.optim.Optimizer, syncer,
                     force: bool = False) -> None:
    """Collective (the synchroniser may gather the optimiser state); rank 0 writes. A stop
    is saved even with train.checkpoint=false: it is the only way to continue the run."""
    if not (cfg.train.checkpoint or force or pos.step):
        return
    opt_state = syncer.optimizer_state(optimizer)
    if ctx.env.is_main:  # one copy of the (identical) model, in the shared run folder
        partial = {k: getattr(pos, k) for k in ("loss_sum", "samples", "busy_s", "wall_s")}
        checkpoint.save(ckpt_dir, pos.epoch, pos.step, {
            "model": module.state_dict(), "optimizer": opt_state, "rng": _rng_state(),
            "partial": partial if pos.step else {},
            "world_size": ctx.env.world_size, "sync": cfg.sync.name})
    ctx.barrier()  # load-bearing: a stopping rank leaves only after the state is on disk


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
