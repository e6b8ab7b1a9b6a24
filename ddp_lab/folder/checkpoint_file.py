"""Checkpoints written atomically: a crash leaves the previous one, never half of a new one.
`epoch_0003.pt`: after 3 epochs; `epoch_0003_step_000120.pt`: and 120 steps of the 4th. A run
continues from the newest whose bytes match its `.sha256` (`sha256sum -c` format, written first); a
damaged one is set aside as `<name>.damaged`, never deleted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import torch

from .files import atomic_open, atomic_write_text, file_hash
from .rundir import checkpoints as _list

SUM = ".sha256"  # the checksum file's suffix
DAMAGED = ".damaged"  # a damaged checkpoint's suffix, once set aside


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to a temp file in the same folder, fsync, its checksum beside it, then rename
    over `path`: a checkpoint never exists without its checksum."""
    with atomic_open(path, "wb", fsync=True) as f:
        torch.save(obj, f)
        f.flush()
        digest = file_hash(Path(f.name), "sha256")
        atomic_write_text(path.with_name(path.name + SUM), f"{digest}  {path.name}\n")


def damage(path: Path) -> Optional[str]:
    """Why the checkpoint at `path` cannot be trusted, or None (no checksum recorded: trusted)."""
    try:
        recorded = path.with_name(path.name + SUM).read_text().split()[0]
    except (OSError, IndexError):
        return None
    try:
        actual = file_hash(path, "sha256")
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if actual != recorded:
        return (f"its SHA-256 differs from the one recorded when it was written "
                f"({path.stat().st_size} bytes)")
    return None


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint (and its checksum) out of the run's timeline; kept."""
    target = path.with_name(path.name + DAMAGED)
    for i in range(2, 1000):
        if not target.exists():
            break
        target = path.with_name(f"{path.name}{DAMAGED}-{i}")
    os.replace(path, target)
    total = path.with_name(path.name + SUM)
    if total.exists():
        os.replace(total, target.with_name(target.name + SUM))
    return target


def newest_intact(ckpt_dir: Path) -> tuple[Optional[Path], list[str]]:
    """The newest checkpoint whose bytes match its checksum, and a line for each newer one found
    damaged and set aside on the way (the caller logs them). One process calls it."""
    said = []
    for _, path in sorted(_list(ckpt_dir), reverse=True):
        why = damage(path)
        if why is None:
            return path, said
        kept = set_aside(path)
        said.append(f"checkpoint {path.name} is damaged ({why}): set aside as {kept.name}, "
                    "continuing from the one before")
    return None, said


def name(epochs: int, step: int = 0) -> str:
    """The file name of the checkpoint after `epochs` epochs and `step` steps of the next."""
    return f"epoch_{epochs:04d}.pt" if step == 0 else f"epoch_{epochs:04d}_step_{step:06d}.pt"


def save(ckpt_dir: Path, epochs: int, step: int, state: dict, keep: int = 2) -> Path:
    """The state after `epochs` epochs and `step` steps of the next; the `keep` newest stay."""
    path = ckpt_dir / name(epochs, step)
    atomic_save({**state, "epoch": epochs, "step": step}, path)
    for _, old in sorted(_list(ckpt_dir))[:-keep] if keep > 0 else []:
        _remove(old)
    return path


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.with_name(path.name + SUM).unlink(missing_ok=True)


def latest(ckpt_dir: Path) -> Optional[Path]:
    """The newest complete checkpoint (temp files never match the name pattern)."""
    return max(_list(ckpt_dir), default=(None, None))[1]


def drop_after(ckpt_dir: Path, pos: tuple[int, int]) -> list[Path]:
    """Delete checkpoints past `pos`: the old timeline's later states must not outlive it."""
    gone = [p for key, p in _list(ckpt_dir) if key > pos]
    for p in gone:
        _remove(p)
    return gone


def load(path: Path, device: torch.device) -> dict:
    """The checkpoint's state, on `device`."""
    try:
        return torch.load(path, map_location=device, weights_only=False)
    except Exception as e:  # noqa: BLE001 -- a clear message beats torch's unpickling trace
        raise RuntimeError(f"checkpoint {path} cannot be read ({e}); move it aside (as "
                           f"{path.name}{DAMAGED}) to resume from the one before") from None
