"""sync=ddp's keys (sync/ddp.py): DistributedDataParallel's own options,
PowerSGD's rank, and the comm hook DDP's reducer runs on each bucket
(sync.hook)."""

from __future__ import annotations

from dataclasses import dataclass

from ..help import doc
from .base import SyncConfig

#: sync.hook of sync=ddp -> what DDP's reducer runs on each gradient
#: bucket: ddp_lab's collectives (the student's ring inside the
#: production engine) or torch's own hooks
#: (torch.distributed.algorithms.ddp_comm_hooks). "none": the one
#: sync.compress picks.
DDP_HOOKS = {
    "none": "the hook sync.compress picks (none: torch's allreduce_hook)",
    "ring": "ddp_lab's textbook ring (collectives/ring.py) on the bucket",
    "ring_prepost": "ddp_lab's pre-posted ring (collectives.PrepostedRingAllReduce), one per bucket",
    "reduce_broadcast": "ddp_lab's tree reduce to rank 0, then its tree broadcast",
    "allreduce": "torch's default_hooks.allreduce_hook",
    "fp16": "torch's default_hooks.fp16_compress_hook",
    "bf16": "torch's default_hooks.bf16_compress_hook",
    "powersgd": "torch's powerSGD_hook (sync.powersgd_rank)",
}
#: the hooks that are also a sync.compress mode (the same hook: one code
#: path)
TORCH_COMPRESS_HOOKS = ("fp16", "bf16", "powersgd")


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
    hook: str = doc("none", "the comm hook DDP runs on each bucket: none (the one sync.compress "
                            "picks) | ring | ring_prepost | reduce_broadcast (ddp_lab's "
                            "collectives) | allreduce | fp16 | bf16 | powersgd (torch's); "
                            "docs/twins.md")

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
        # DDP itself would take it silently
        if cfg.bucket_cap_mb < 0:
            raise ValueError(f"sync.bucket_cap_mb={cfg.bucket_cap_mb}: must be >= 0 "
                             "(0 = one bucket per parameter)")
        hook, compress = cfg.get("hook", "none"), cfg.get("compress", "none")
        if hook not in DDP_HOOKS:
            raise ValueError(f"sync.hook={hook}: choose one of {', '.join(DDP_HOOKS)}")
        if hook != "none" and compress != "none" and hook != compress:
            raise ValueError(f"sync=ddp sync.hook={hook} sync.compress={compress}: both choose the "
                             f"comm hook DDP runs on each bucket (sync.compress={compress} on ddp "
                             f"is torch's {compress} hook, as sync.hook={compress}): set one of them")
        if cfg.powersgd_rank < 1:
            raise ValueError(f"sync.powersgd_rank={cfg.powersgd_rank}: must be >= 1 (the rank "
                             "of PowerSGD's low-rank approximation; 1 is the default)")
