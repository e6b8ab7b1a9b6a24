"""A run's final weights: `model.pt` in the run folder (the whole model's state dict, as stop 0
writes it) and their digest (summary.json `weights_sha256`), so the report can put runs of one
workload and seed side by side and say how far each ended from another (docs/twins.md)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

import torch

from .checkpoint_file import atomic_save

WEIGHTS = "model.pt"


def digest(state: dict) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in the state dict's order: equal
    digests, the same weights bit for bit."""
    h = hashlib.sha256()
    for name, t in state.items():
        if not torch.is_tensor(t):
            continue
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def save(run_dir: Path, state: dict) -> str:
    """Write `state` (plain tensors) as the run's final weights; their digest."""
    state = {k: v.detach().to("cpu") for k, v in state.items() if torch.is_tensor(v)}
    atomic_save(state, Path(run_dir) / WEIGHTS)
    return digest(state)


def load(run_dir: Path) -> Optional[dict]:
    """The run's final weights, or None when it wrote none."""
    path = Path(run_dir) / WEIGHTS
    return torch.load(path, map_location="cpu", weights_only=True) if path.is_file() else None
