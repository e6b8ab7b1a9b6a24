"""sync=zero1's keys (sync/zero1.py): the buckets'; overlap and
compression refused."""

from __future__ import annotations

from dataclasses import dataclass

from .allreduce import BucketSyncConfig


@dataclass
class Zero1SyncConfig(BucketSyncConfig):
    """ZeRO stage 1: gradients reduce-scattered, each rank steps the
    optimiser on its shard of the flat weights, which are then
    all-gathered (ddp_lab/sync/zero1.py)."""

    @classmethod
    def check(cls, cfg: Zero1SyncConfig, world_size: int) -> None:
        super().check(cfg, world_size)
        if cfg.get("overlap", False):
            raise ValueError("sync=zero1 sync.overlap=true: zero1 reduce-scatters after backward; "
                             "drop sync.overlap (or use sync=ddp for overlapped all-reduces)")
        if cfg.get("compress", "none") != "none":
            raise ValueError(f"sync=zero1 sync.compress={cfg.compress}: zero1 sends fp32 "
                             f"gradients; drop sync.compress, or use sync=ring "
                             f"sync.compress={cfg.compress}")
