"""sync=torch_zero's keys (sync/torch_zero.py): DDP's, as torch's
ZeroRedundancyOptimizer runs over DDP; compression and comm hooks
refused (DDP's all-reduce is the plain one here)."""

from __future__ import annotations

from dataclasses import dataclass

from .ddp import DDPSyncConfig


@dataclass
class TorchZeroSyncConfig(DDPSyncConfig):
    """torch.distributed.optim.ZeroRedundancyOptimizer over
    DistributedDataParallel: DDP all-reduces the gradients, each rank
    steps the whole parameters it owns (placed greedily), then every
    rank broadcasts its own (docs/twins.md)."""

    @classmethod
    def check(cls, cfg: TorchZeroSyncConfig, world_size: int) -> None:
        super().check(cfg, world_size)
        for key in ("compress", "hook"):
            if cfg.get(key, "none") != "none":
                raise ValueError(f"sync=torch_zero sync.{key}={cfg[key]}: torch_zero is the "
                                 f"library twin of sync=zero1 and sends fp32 through DDP's plain "
                                 f"all-reduce; drop sync.{key} (or use sync=ddp sync.{key}="
                                 f"{cfg[key]})")
        if cfg.get("powersgd_rank", 1) != 1:
            raise ValueError(f"sync=torch_zero sync.powersgd_rank={cfg.powersgd_rank}: torch_zero "
                             f"runs no PowerSGD (compression refused); drop sync.powersgd_rank")
