"""train()'s checkpoint part for a run folder, on every rank: `load` (where to start, the state
restored), `save` after each epoch, `save_stop` where a stop leaves the run; the files themselves
are `ddp_lab.folder.checkpoint_file`'s. Every rank calls every method in the same order (saving is
collective); rank 0 alone writes.
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Any, Optional

import torch

from ..config import BatchPlan, TrainConfig
from ..folder import checkpoint_file as checkpoint
from ..folder.rundir import resume_mode
from ..world.distributed import DistContext
from .epochs import StopInfo
from .records import MeasuredEpoch, Position

log = logging.getLogger("ddp_lab")


class Checkpointer:
    """The checkpoints of one run on this rank; see the module docstring."""

    def __init__(self, train: TrainConfig, ctx: DistContext, ckpt_dir: Path, batching: BatchPlan):
        self.train, self.ctx, self.ckpt_dir, self.batching = train, ctx, ckpt_dir, batching

    def load(self, parts: Any) -> Position:
        """When continuing (train.resume auto/true, a restart), the newest checkpoint loaded into
        `parts`: the position it holds. Later ones of an older timeline go."""
        self.optimizer, self.syncer = parts.optimizer, parts.syncer
        env, ctx = self.ctx.env, self.ctx
        mode = resume_mode(self.train.resume)
        # TORCHELASTIC_RESTART_COUNT counts this node's restarts only (pytorch#108158): agree;
        # SLURM_RESTART_COUNT: a scheduler's second (or later) start of the same run
        requeued = int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0
        restarted = ctx.any_rank(env.restart_count > 0 or requeued)
        if mode == "false" and not restarted:
            return Position()
        if env.is_main:  # damaged checkpoints are set aside: the newest left is intact
            for line in checkpoint.newest_intact(self.ckpt_dir)[1]:
                log.warning(line)
        # load-bearing: every rank picks from what rank 0 left
        ctx.barrier()
        path = checkpoint.latest(self.ckpt_dir)
        if path is None and mode == "true":
            raise FileNotFoundError(f"train.resume=true but {self.ckpt_dir} holds no checkpoint: "
                                    "point run.dir at a run that completed an epoch")
        if path is None:
            return Position()
        state = checkpoint.load(path, ctx.device)
        self.syncer.load_model_state(state["model"])  # fsdp2: its shards
        built = [g.get("capturable") for g in self.optimizer.param_groups]
        self.syncer.load_optimizer_state(self.optimizer, state["optimizer"])  # zero1: its shard
        # a train.cuda_graph run's Adam saved capturable=True: this run's own flag stands
        for group, flag in zip(self.optimizer.param_groups, built):
            if flag is not None:
                group["capturable"] = flag
        # (strong scaling: every world size trains on the same samples at every step)
        if state.get("world_size") != env.world_size and self.batching.scaling != "strong":
            log.warning("checkpoint was written by %s ranks, resuming on %d: the data order "
                        "differs from an uninterrupted run", state.get("world_size"),
                        env.world_size)
        if "rng" in state:
            _set_rng(state["rng"])
        pos = Position(state["epoch"], state.get("step", 0), **state.get("partial", {}))
        # load-bearing: every rank has read the checkpoint before rank 0 prunes
        ctx.barrier()
        if env.is_main:
            checkpoint.drop_after(self.ckpt_dir, (pos.epoch, pos.step))
        log.info("resumed from %s (epoch %d done%s)", path.name, pos.epoch,
                 f", {pos.step} steps into the next" if pos.step else "")
        return pos

    def save(self, epochs_done: int) -> None:
        """Collective, after an epoch: its checkpoint (train.checkpoint)."""
        self.save_at(Position(epochs_done))

    def save_at(self, pos: Position, force: bool = False) -> None:
        """Collective; rank 0 writes. A stop saves even with train.checkpoint=false."""
        if not (self.train.checkpoint or force or pos.step):
            return
        opt_state = self.syncer.optimizer_state(self.optimizer)
        model_state = self.syncer.model_state()  # collective: fsdp2 gathers its shards
        # one copy of the (identical) model, in the shared run folder
        if self.ctx.env.is_main:
            partial = {k: getattr(pos, k) for k in ("loss_sum", "samples", "busy_s", "wall_s",
                                                    "correct")}
            checkpoint.save(self.ckpt_dir, pos.epoch, pos.step, {
                "model": model_state, "optimizer": opt_state, "rng": _rng_state(),
                "partial": partial if pos.step else {},
                "world_size": self.ctx.env.world_size, "sync": self.syncer.name})
        # load-bearing: a stopping rank leaves only after the state is on disk
        self.ctx.barrier()

    def save_stop(self, stop: StopInfo, epochs_done: int,
                  measured: Optional[MeasuredEpoch] = None) -> dict[str, Any]:
        """Collective. Every rank agreed to stop: save where the run stands (mid-epoch: `measured`;
        between epochs: the epoch's checkpoint) and return `Telemetry.finish`'s keywords."""
        if measured is None:
            here = Position(epochs_done)
            if not self.train.checkpoint:
                self.save_at(here, force=True)
        else:
            m, before = measured, measured.resumed_part
            # the shard's last batch may be short: steps done rounds the samples up
            done = m.resumed_at_step - (-m.samples // self.batching.per_rank)
            g_loss, g_samples, g_correct = self.ctx.reduce_floats(
                [m.loss_sum, float(m.samples), float(m.correct)])
            here = Position(m.epoch - 1, done, before.loss_sum + g_loss,
                            before.samples + int(g_samples), before.busy_s + m.busy_s,
                            before.wall_s + m.wall_s, before.correct + int(g_correct))
            self.save_at(here)
        return {"status": stop.status, "position": (here.epoch, here.step),
                "stop_reason": stop.reason}


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
