"""The bucketed synchronisers' keys (sync/allreduce.py; tree and
butterfly take these keys as they are, ring, reduce_broadcast,
hierarchical and zero1 add theirs)."""

from __future__ import annotations

from dataclasses import dataclass

from ..help import doc
from .base import SyncConfig


@dataclass
class BucketSyncConfig(SyncConfig):
    """Flattened gradient buckets, one collective call per bucket."""

    bucket_mb: float = doc(25.0, "bucket size in MB (1e6 bytes); 0 = one call per parameter")

    @classmethod
    def check(cls, cfg: BucketSyncConfig, world_size: int) -> None:
        if cfg.bucket_mb < 0:
            raise ValueError(f"sync.bucket_mb={cfg.bucket_mb}: must be >= 0 "
                             "(0 = one call per parameter)")
        if cfg.compress == "powersgd":
            raise ValueError(f"sync.compress=powersgd: only sync=ddp runs it (torch's PowerSGD is "
                             f"a DDP comm hook): use sync=ddp, or sync.compress=fp16 or bf16 "
                             f"with sync={cfg.name}")
