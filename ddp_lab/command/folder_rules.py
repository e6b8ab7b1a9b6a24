"""The rules on folders: run.dir or run.root and data.root can be made
and written."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig


def folder_problem(key: str, value: str, fix: str) -> Optional[str]:
    """Why folder `value` (given as `key`) cannot be made and written,
    or None: a probe folder made inside it (as `mkdir -p` would) lets
    the OS refuse in its own words; what the probe made is removed, so a
    checked command leaves nothing."""
    path = Path(value).expanduser().absolute()
    probe = path / f".ddp_lab_probe_{os.getpid()}"
    for _ in range(5):
        error = _probe(probe)
        # another command probing the same new folder removed it as ours
        # went in: again
        if not isinstance(error, FileNotFoundError):
            break
    if error is None:
        return None
    reason = getattr(error, "strerror", None) or str(error)
    where = getattr(error, "filename", None)
    at = f" (making {where})" if where and Path(where) not in (path, probe) else ""
    return f"{key}={value} cannot be made or written: {reason}{at}: {fix}"


def _probe(probe: Path) -> Optional[Exception]:
    """Make the folder `probe` (and the folders on the way), then remove
    what was made; the OS's error if it refused."""
    # the probe and the folders to make on the way, innermost first
    missing = [probe]
    while not os.path.exists(missing[-1].parent) and missing[-1].parent != missing[-1]:
        missing.append(missing[-1].parent)
    made: list[Path] = []
    try:
        for folder in reversed(missing):
            try:
                folder.mkdir()
                made.append(folder)
            except FileExistsError:
                # made meanwhile by someone else: theirs, not ours
                if folder == probe or not folder.is_dir():
                    raise
    except (OSError, ValueError) as e:
        return e
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
    return None


def run_folder(cfg: DictConfig) -> Optional[str]:
    if cfg.run.dir:
        return folder_problem("run.dir", cfg.run.dir, "give a folder you can write (or leave "
                              "run.dir unset for a new folder under run.root)")
    return folder_problem("run.root", cfg.run.root, "give a folder you can write, e.g. "
                          "run.root=$HOME/ddp_lab_runs")


def data_folder(cfg: DictConfig) -> Optional[str]:
    if cfg.data.node_local:
        # node-local storage: it exists on the compute nodes, not
        # necessarily here
        return None
    root = Path(cfg.data.root).expanduser()
    if root.is_dir() and (root / "MNIST" / "raw").is_dir() and not os.access(root, os.W_OK):
        # a read-only shared copy that is already there: nothing to
        # write
        return None
    return folder_problem("data.root", cfg.data.root, "give a folder you can write (the "
                          "dataset is fetched there), e.g. data.root=$HOME/data")
