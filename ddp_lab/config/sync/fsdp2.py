"""sync=fsdp2's keys (sync/fsdp2.py): where FSDP2 reshards; overlap and
compression refused. A torch without torch.distributed.fsdp.fully_shard
is refused before any process starts (command/machine_rules.py,
world/torch_support.py: it needs torch, this file is torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

from ..help import doc
from .base import SyncConfig


@dataclass
class FSDP2SyncConfig(SyncConfig):
    """torch.distributed.fsdp.fully_shard (FSDP2) on each child module
    with parameters, then the root: weights, gradients and optimiser
    state sharded per parameter (Shard(0) DTensors), all-gathered before
    each forward, gradients reduce-scattered (docs/twins.md)."""

    overlap: bool = doc(True, "FSDP2 overlaps its reduce-scatters with backward: "
                              "always true here")
    reshard_after_forward: bool = doc(True, "free each module's gathered weights after its "
                                            "forward and all-gather them again in backward "
                                            "(false: keep them until after backward)")

    @classmethod
    def check(cls, cfg: FSDP2SyncConfig, world_size: int) -> None:
        if not cfg.get("overlap", True):
            raise ValueError("sync=fsdp2 sync.overlap=false: FSDP2 always reduce-scatters "
                             "during backward; drop sync.overlap=false")
        if cfg.get("compress", "none") != "none":
            raise ValueError(f"sync=fsdp2 sync.compress={cfg.compress}: fsdp2 runs fp32 here "
                             f"(FSDP2's MixedPrecisionPolicy is not wired); drop sync.compress, "
                             f"or use sync=ddp sync.compress={cfg.compress}")
