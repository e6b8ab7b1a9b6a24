"""Gradient synchronisers, chosen with the `sync` config group."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .base import Synchroniser
from .ddp import DDPSync

REGISTRY: dict[str, type[Synchroniser]] = {
    "ddp": DDPSync,
}


def build_sync(cfg: Any, module: nn.Module, device: torch.device, world_size: int) -> Synchroniser:
    try:
        cls = REGISTRY[cfg.name]
    except KeyError:
        raise ValueError(f"unknown sync '{cfg.name}': choose one of {', '.join(REGISTRY)}") from None
    return cls(cfg, module, device, world_size)


__all__ = ["REGISTRY", "Synchroniser", "build_sync"]
