"""The run's machinery around the lesson's loop, on every rank.

The worker hands the loop (ddp_lab/train.py) to `run_training`, which
runs it with a `RankMachinery`: resume and checkpoints
(`Checkpointer`), the epoch's clocks, stop agreement and profiler
(`EpochControl`), the records (`Telemetry`), compile and CUDA graphs.
The loop calls it through `train.Machinery`; nothing here imports the
loop.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

from ..config import Config, batch_plan
from ..folder import heartbeat
from ..folder import weights as weights_file
from ..folder.files import read_json_or_empty
from ..folder.records import RunSummary
from ..world.distributed import DistContext
from .checkpointer import Checkpointer
from .compile import preflight_and_compile
from .cuda_graph import build_stream, step_runner
from .epoch import EpochControl, Position, Stopped
from .telemetry import Telemetry

log = logging.getLogger("ddp_lab")


def run_training(train: Callable, cfg: Config, ctx: DistContext,
                 run_dir: Path) -> RunSummary:
    """`train(cfg, ctx, machinery)` with the run's machinery; a stop
    every rank agreed on ends it here, saved."""
    machinery = RankMachinery(cfg, ctx, run_dir)
    with machinery.stops:
        try:
            return train(cfg, ctx, machinery)
        except Stopped as stop:
            return machinery.stopped(stop)


class RankMachinery:
    """`train.Machinery` for a run folder; see the module docstring."""

    def __init__(self, cfg: Config, ctx: DistContext, run_dir: Path):
        self.cfg, self.ctx, self.run_dir = cfg, ctx, run_dir
        self.plan = batch_plan(cfg.train, ctx.env.world_size)
        # the stop agreement, entered at start, left at the end
        self.stops = ExitStack()
        # epochs of a finished run started again
        self.done_before = None

    def building(self):
        # train.cuda_graph: DDP built on the side stream it is captured
        # on
        return build_stream(self.cfg.train, self.ctx.device)

    def start(self, clock, parts, splits, steps: Callable):
        cfg, ctx, run_dir = self.cfg, self.ctx, self.run_dir
        model, self.syncer, self.optimizer = parts
        # its calls: where this rank is (status)
        heartbeat.current().follow(comm=self.syncer.comm)
        compile_s = preflight_and_compile(
            cfg.train, self.syncer, self.optimizer, splits,
            self.plan.micro, ctx, steps)
        self.ckpt = Checkpointer(
            cfg.train, ctx, run_dir / "checkpoints", model,
            self.optimizer, self.syncer, self.plan)
        # epoch 0 step 0, or where the newest checkpoint stands
        start = self.ckpt.load()
        if start.epoch >= cfg.train.epochs:
            self.done_before = start.epoch
            return start.epoch, steps
        self.control = EpochControl(
            cfg.train, cfg.timing, cfg.debug, ctx, clock, self.syncer,
            self.ckpt.resumed_part, run_dir)
        self.timer = self.control.timer
        n_steps = steps_per_epoch(cfg.train, splits)
        self.telemetry = Telemetry(
            cfg, ctx, run_dir, n_steps, self.syncer.bytes_exact,
            plan=self.plan, compile_s=compile_s, control=self.control)
        self.telemetry.start(start.epoch, start.step)
        self.stops.enter_context(self.control.stop_control(run_dir))
        if cfg.train.cuda_graph:
            steps = step_runner(cfg.train, self.syncer, self.optimizer,
                                steps)
        return start.epoch, steps

    def batches(self, epoch: int, shard):
        return self.control.begin(epoch, shard, self.telemetry.step_numbers)

    def steps_done(self, batches, loss_sum, correct) -> None:
        # raises Stopped when the ranks agreed to stop mid-epoch
        self.measured = self.control.end(batches, loss_sum, correct)

    def epoch_done(self, test) -> None:
        self.measured.test = test
        done = self.measured.epoch
        # the checkpoint, then the record: it never outlives its state
        self.ckpt.save(Position(done))
        self.telemetry.epoch(self.measured)
        # the failure hook; raises Stopped
        self.control.between_epochs(done)

    def finish(self, parts) -> RunSummary:
        if self.done_before is not None:
            return finished(self.run_dir, self.done_before)
        self.stops.close()
        syncer, optimizer = parts.syncer, parts.optimizer
        # model.pt: the report compares runs by it
        weights = final_weights(syncer, self.ctx, self.run_dir)
        return self.telemetry.finish(
            memory=memory_per_rank(syncer, optimizer, self.ctx),
            weights_sha256=weights)

    def stopped(self, stop: Stopped) -> RunSummary:
        """Collective: save where the run stands, then its summary."""
        memory = memory_per_rank(self.syncer, self.optimizer, self.ctx)
        return self.telemetry.finish(**self.ckpt.on_stop(stop),
                                     memory=memory)


def memory_per_rank(syncer, optimizer, ctx: DistContext) -> dict:
    """Collective: this rank's bytes and every rank's optimiser
    state (a sharded optimiser's largest and smallest shard)."""
    mine = syncer.memory(optimizer)
    every = ctx.gather_objects(mine["optimizer_state_bytes"])
    return {**mine,
            "optimizer_state_bytes_per_rank": [int(b) for b in every]}


def final_weights(syncer, ctx: DistContext, run_dir: Path):
    """Collective: the whole model written to model.pt by rank 0;
    its digest there (summary.json `weights_sha256`), else None."""
    # fsdp2: its shards gathered
    state = syncer.model_state()
    if not ctx.env.is_main:
        return None
    return weights_file.save(run_dir, state)


def steps_per_epoch(train, splits) -> int:
    """The shard's batches, or train.max_steps_per_epoch of them."""
    n, most = len(splits.train), train.max_steps_per_epoch
    return min(n, most) if most > 0 else n


def finished(run_dir: Path, epochs: int) -> RunSummary:
    """A run that has done all its epochs, started again: as it is."""
    log.info("the run in %s has completed its %d epochs: nothing to do",
             run_dir, epochs)
    summary = read_json_or_empty(run_dir / "summary.json")
    return RunSummary.from_dict(summary)
