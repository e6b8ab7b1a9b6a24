"""sync=reduce_broadcast's keys (sync/reduce_broadcast.py): the
buckets', and the root."""

from __future__ import annotations

from dataclasses import dataclass

from ..help import doc
from .allreduce import BucketSyncConfig


@dataclass
class ReduceBroadcastSyncConfig(BucketSyncConfig):
    """Reduce gradients to a root, step there, broadcast the
    parameters."""

    root: int = doc(0, "the rank that averages, steps the optimiser and holds its state")

    @classmethod
    def check(cls, cfg: ReduceBroadcastSyncConfig, world_size: int) -> None:
        super().check(cfg, world_size)
        if not 0 <= cfg.root < world_size:
            raise ValueError(f"sync.root={cfg.root}: must be a rank, 0..{world_size - 1}")
