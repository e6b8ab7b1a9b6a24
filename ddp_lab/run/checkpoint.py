"""Checkpoints written atomically: a crash leaves the previous one, never half of a new one.

Names order the run's timeline: `epoch_0003.pt` holds the state after 3 epochs,
`epoch_0003_step_000120.pt` after 3 epochs and 120 steps of the 4th (a graceful stop).
The newest by (epochs, step) is the one a run continues from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from .files import atomic_open
from .rundir import checkpoint_position, checkpoints as _list


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to a temp file in the same folder, fsync, then rename over `path`."""
    with atomic_open(path, "wb", fsync=True) as f:
        torch.save(obj, f)


def name(epochs: int, step: int = 0) -> str:
    return f"epoch_{epochs:04d}.pt" if step == 0 else f"epoch_{epochs:04d}_step_{step:06d}.pt"


def save(ckpt_dir: Path, epochs: int, step: int, state: dict, keep: int = 2) -> Path:
    """The state after `epochs` epochs and `step` steps of the next; the `keep` newest stay."""
    path = ckpt_dir / name(epochs, step)
    atomic_save({**state, "epoch": epochs, "step": step}, path)
    for _, old in sorted(_list(ckpt_dir))[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return path


def save_epoch(ckpt_dir: Path, epoch: int, state: dict, keep: int = 2) -> Path:
    return save(ckpt_dir, epoch, 0, state, keep)


def position(path: Path) -> tuple[int, int]:
    """(epochs done, steps of the next epoch) of a checkpoint file name."""
    pos = checkpoint_position(path.name)
    if pos is None:
        raise ValueError(f"{path.name} is not a checkpoint name")
    return pos


def latest(ckpt_dir: Path) -> Optional[Path]:
    """The newest complete checkpoint (temp files never match the name pattern)."""
    found = sorted(_list(ckpt_dir))
    return found[-1][1] if found else None


def drop_after(ckpt_dir: Path, pos: tuple[int, int]) -> list[Path]:
    """Delete checkpoints past `pos`: a run continuing from `pos` starts a new timeline, and
    the old one's later states must not outlive it."""
    gone = [p for key, p in _list(ckpt_dir) if key > pos]
    for p in gone:
        p.unlink(missing_ok=True)
    return gone


def load(path: Path, device: torch.device) -> dict:
    try:
        return torch.load(path, map_location=device, weights_only=False)
    except Exception as e:  # noqa: BLE001 -- a clear message beats torch's unpickling trace
        raise RuntimeError(f"checkpoint {path} cannot be read ({e}); delete it to resume "
                           "from the one before") from None
