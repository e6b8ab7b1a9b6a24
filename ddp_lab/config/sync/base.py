"""The keys every synchroniser has (sync/synchroniser.py's interface), and the
rule hook each schema fills: `check(cfg, world_size)` raises ValueError,
with the fix, for a config the synchroniser cannot run."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

from ..help import doc

COMPRESS_MODES = ("none", "fp16", "bf16", "powersgd")


@dataclass
class SyncConfig:
    """How gradients are synchronised across ranks."""

    name: str = doc(MISSING, "ddp | naive | allreduce | reduce_broadcast | ring | tree | "
                             "butterfly | hierarchical | zero1 | torch_zero | fsdp2 "
                             "(ddp_lab/sync/<name>.py)")
    overlap: bool = doc(False, "start each gradient bucket's collective during backward, "
                               "as soon as the bucket is ready (DDP's overlap; ddp "
                               "always overlaps), instead of after backward")
    compress: str = doc("none", "gradients on the wire: none | fp16 | bf16 | powersgd (ddp only)")

    @classmethod
    def check(cls, cfg: SyncConfig, world_size: int) -> None:
        """Raise ValueError, with the fix, for a section the
        synchroniser cannot run on `world_size` ranks (before any
        process starts, and where the synchroniser is built)."""
