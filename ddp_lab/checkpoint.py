"""Checkpoints written atomically: a crash leaves the previous one, never half of a new one."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

import torch

from .files import atomic_open

_NAME = re.compile(r"epoch_(\d+)\.pt$")


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to a temp file in the same folder, fsync, then rename over `path`."""
    with atomic_open(path, "wb", fsync=True) as f:
        torch.save(obj, f)


def save_epoch(ckpt_dir: Path, epoch: int, state: dict, keep: int = 2) -> Path:
    path = ckpt_dir / f"epoch_{epoch:04d}.pt"
    atomic_save({**state, "epoch": epoch}, path)
    for old in sorted(_list(ckpt_dir))[:-keep] if keep > 0 else []:
        old[1].unlink(missing_ok=True)
    return path


def _list(ckpt_dir: Path) -> list[tuple[int, Path]]:
    if not ckpt_dir.is_dir():
        return []
    out = []
    for p in ckpt_dir.iterdir():
        m = _NAME.match(p.name)
        if m:
            out.append((int(m.group(1)), p))
    return out


def latest(ckpt_dir: Path) -> Optional[Path]:
    """The newest complete checkpoint (temp files never match the name pattern)."""
    found = sorted(_list(ckpt_dir))
    return found[-1][1] if found else None


def load(path: Path, device: torch.device) -> dict:
    try:
        return torch.load(path, map_location=device, weights_only=False)
    except Exception as e:  # noqa: BLE001 -- a clear message beats torch's unpickling trace
        raise RuntimeError(f"checkpoint {path} cannot be read ({e}); delete it to resume "
                           "from the one before") from None
