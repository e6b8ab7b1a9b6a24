"""Gradient synchronisers, chosen with the `sync` config group (one file each)."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from ..registry import Registry
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
    return sync_class(cfg.name)(cfg, module, device, world_size, clock=clock, timing=timing)


__all__ = ["REGISTRY", "SYNCS", "Synchroniser", "build_sync", "sync_class"]
