"""sync=ddp's keys (sync/ddp.py): DistributedDataParallel's own options, and PowerSGD's rank."""

from __future__ import annotations

from dataclasses import dataclass

from ..help import doc
from .base import SyncConfig


@dataclass
class DDPSyncConfig(SyncConfig):
    """torch.nn.parallel.DistributedDataParallel."""

    overlap: bool = doc(True, "DDP overlaps its bucket all-reduces "
                              "with backward: always true here")
    powersgd_rank: int = doc(1, "sync.compress=powersgd: the rank of "
                                "PowerSGD's low-rank approximation")
    bucket_cap_mb: float = doc(25.0, "DDP gradient bucket size in MB")
    gradient_as_bucket_view: bool = doc(False, "let .grad alias the bucket memory (saves a copy)")
    static_graph: bool = doc(False, "promise DDP the graph never changes "
                                    "(needs every parameter used)")
    find_unused_parameters: bool = doc(False, "let DDP look for parameters that got no gradient")

    @classmethod
    def check(cls, cfg: DDPSyncConfig, world_size: int) -> None:
        if not cfg.get("overlap", True):
            raise ValueError("sync=ddp sync.overlap=false: DDP always overlaps its bucket "
                             "all-reduces with backward; drop sync.overlap=false (or use "
                             "sync=allreduce sync.overlap=false for the same buckets after "
                             "backward)")
        if cfg.static_graph and cfg.find_unused_parameters:
            raise ValueError("sync.static_graph=true and sync.find_unused_parameters=true "
                             "contradict each other: set one of them to false")
        if cfg.bucket_cap_mb < 0:  # DDP itself would take it silently
            raise ValueError(f"sync.bucket_cap_mb={cfg.bucket_cap_mb}: must be >= 0 "
                             "(0 = one bucket per parameter)")
        if cfg.powersgd_rank < 1:
            raise ValueError(f"sync.powersgd_rank={cfg.powersgd_rank}: must be >= 1 (the rank "
                             "of PowerSGD's low-rank approximation; 1 is the default)")
