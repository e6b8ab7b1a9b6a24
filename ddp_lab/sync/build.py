"""Where a synchroniser is built: `SYNCS` names every synchroniser's
class (sync/<name>.py); `build_sync(cfg, ...)`, what the trainer calls,
runs the section's config rules (its schema's `check`,
config/sync.py) and, for `sync.overlap=true` on more than one
rank, picks an all-reduce family class's overlapped variant
(sync/allreduce.py): neither belongs to the class itself."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..config import check_sync, SyncConfig, with_defaults
from ..config.registry import Registry
from ..timing import Clock
from .allreduce import AllReduceSync, ButterflySync, overlapped, TreeSync
from .custom import CustomSync
from .ddp import DDPSync
from .fsdp2 import FSDP2Sync
from .hierarchical import HierarchicalSync
from .naive import NaiveSync
from .reduce_broadcast import ReduceBroadcastSync
from .ring import RingSync
from .synchroniser import Synchroniser
from .torch_zero import TorchZeroSync
from .zero1 import Zero1Sync

SYNCS: Registry[type[Synchroniser]] = Registry(
    "sync",
    {
        "ddp": DDPSync,
        "naive": NaiveSync,
        "allreduce": AllReduceSync,
        "reduce_broadcast": ReduceBroadcastSync,
        "ring": RingSync,
        "tree": TreeSync,
        "butterfly": ButterflySync,
        "hierarchical": HierarchicalSync,
        "zero1": Zero1Sync,
        # the student's own all-reduce (docs/exercises.md)
        "custom": CustomSync,
        # torch's library twins (docs/twins.md)
        "torch_zero": TorchZeroSync,
        "fsdp2": FSDP2Sync,
    },
)


def sync_class(name: str, overlap: bool = False) -> type[Synchroniser]:
    """The class of `sync=name`; with `overlap`, an all-reduce family
    class's overlapped variant (ddp and reduce_broadcast overlap by
    themselves, per their section)."""
    # UnknownName (a ValueError) lists the valid ones
    cls = SYNCS.get(name)
    return overlapped(cls) if overlap and issubclass(cls, AllReduceSync) else cls


def build_sync(
    cfg: SyncConfig,
    module: nn.Module,
    device: torch.device,
    world_size: int,
    clock: Optional[Clock] = None,
    timing: bool = True,
) -> Synchroniser:
    """The synchroniser `cfg` names, for `module` on `world_size`
    ranks."""
    check_sync(cfg, world_size)
    overlap = bool(with_defaults(cfg).get("overlap", False)) and world_size > 1
    return sync_class(cfg.name, overlap)(
        cfg, module, device, world_size, clock=clock, timing=timing
    )
