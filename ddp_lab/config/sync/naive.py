"""sync=naive (sync/naive.py) has no keys of its own; its rules refuse
overlap and compression, each with the synchroniser that runs it."""

from __future__ import annotations

from dataclasses import dataclass

from .base import SyncConfig


@dataclass
class NaiveSyncConfig(SyncConfig):
    """One all_reduce per parameter's .grad after backward, divided by
    the world size (ddp_lab/sync/naive.py); no keys of its own, overlap
    and compress refused."""

    @classmethod
    def check(cls, cfg: NaiveSyncConfig, world_size: int) -> None:
        if cfg.get("overlap", False):
            raise ValueError("sync=naive sync.overlap=true: naive starts its calls after backward; "
                             "drop sync.overlap, or use sync=allreduce sync.bucket_mb=0 "
                             "sync.overlap=true (the same calls, each as soon as its .grad is ready)")
        if cfg.get("compress", "none") != "none":
            raise ValueError(f"sync=naive sync.compress={cfg.compress}: naive sends each .grad as "
                             f"it is; drop sync.compress, or use sync=allreduce sync.bucket_mb=0 "
                             f"sync.compress={cfg.compress}")
