"""Gradient synchronisers, chosen with the `sync` config group (one file each)."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from ..config import check_sync
from ..registry import Registry
from ..run import progress
from ..timing import Clock
from .allreduce import AllReduceSync
from .base import Synchroniser
from .butterfly import ButterflySync
from .ddp import DDPSync
from .hierarchical import HierarchicalSync
from .naive import NaiveSync
from .reduce_broadcast import ReduceBroadcastSync
from .ring import RingSync
from .tree import TreeSync
from .zero1 import Zero1Sync

SYNCS: Registry[type[Synchroniser]] = Registry("sync", {
    "ddp": DDPSync,
    "naive": NaiveSync,
    "allreduce": AllReduceSync,
    "reduce_broadcast": ReduceBroadcastSync,
    "ring": RingSync,
    "tree": TreeSync,
    "butterfly": ButterflySync,
    "hierarchical": HierarchicalSync,
    "zero1": Zero1Sync,
})
REGISTRY = SYNCS  # the name earlier code and users' scripts import


def sync_class(name: str) -> type[Synchroniser]:
    return SYNCS.get(name)  # UnknownName (a ValueError) lists the valid ones


def build_sync(cfg: Any, module: nn.Module, device: torch.device, world_size: int,
               clock: Optional[Clock] = None, timing: bool = True) -> Synchroniser:
    """The synchroniser `cfg` names, for `module` on `world_size` ranks: its config rules
    checked first (its schema's `check`, config/sync.py; the submitting side ran them too), and
    every collective it enters counted in this rank's progress record (the rank behind
    the others is the one with the smaller count: ddp_lab/run/progress.py)."""
    check_sync(cfg, world_size)
    syncer = sync_class(cfg.name)(cfg, module, device, world_size, clock=clock, timing=timing)
    syncer.comm.on_collective = progress.current().collective
    return syncer


__all__ = ["REGISTRY", "SYNCS", "Synchroniser", "build_sync", "sync_class"]
