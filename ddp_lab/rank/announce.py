"""What a rank says as its run starts: the world, the batches, the
choices torch could not honour and its CPU threads; and the facts the
records keep of it (threads, the study point)."""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch
from omegaconf import OmegaConf

from ..config import BatchPlan, Config
from ..world import cpu, torch_support

log = logging.getLogger("ddp_lab")


def announce(ctx: Any, cfg: Config, plan: BatchPlan,
             steps_per_epoch: int) -> None:
    """The run's first lines on the console."""
    log.info("world %d (%d node%s x %d) %s/%s sync=%s model=%s %d steps of %d a rank "
             "(global %d, %s%s)", ctx.env.world_size, ctx.env.num_nodes,
             "s" if ctx.env.num_nodes > 1 else "",
             ctx.env.local_world_size, ctx.backend, ctx.device, cfg.sync.name,
             cfg.model.name, steps_per_epoch, plan.per_rank, plan.global_batch,
             plan.scaling, f"; {plan.accumulation} micro-batches of {plan.micro}"
             if plan.accumulation > 1 else "")
    # defaults the installed torch could not honour
    for line in torch_support.choices():
        log.info("%s", line)
    if ctx.device.type == "cpu":
        share = cpu_share()
        n = share["threads"]
        log.info("%d CPU thread%s a rank%s: %s", n, "s" if n > 1 else "",
                 f" (waiting threads {share['wait']})" if n > 1 else "", share["why"])


def cpu_share() -> dict:
    """This rank's torch threads, why, and how they wait
    (ddp_lab/world/cpu.py)."""
    return {"threads": torch.get_num_threads(), "why": cpu.chosen.why if cpu.chosen else "",
            "wait": cpu.wait_policy()}


def study_point(cfg: Config) -> Optional[dict]:
    """The study this run is a point of (its config's `study_point`,
    ddp_lab/command/study.py)."""
    point = cfg.study_point
    return OmegaConf.to_container(point) if point is not None else None
