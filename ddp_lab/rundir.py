"""The run folder: made once, on the submitting machine, before any rank starts."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from .files import atomic_write_text


def make_run_dir(cfg: DictConfig, label: Optional[str] = None) -> Path:
    """run.dir if given (reused: that is how a run is resumed), else a fresh unique folder
    `<run.root>/<date>_<time>_<label>` (suffixed when two runs start in one second); the
    label defaults to `<sync>_<model>_<launcher>`."""
    if cfg.run.dir:
        path = Path(cfg.run.dir).expanduser().resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path
    root = Path(cfg.run.root).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    label = label or f"{cfg.sync.name}_{cfg.model.name}_{cfg.launcher.name}"
    base = f"{stamp}_{label}"
    for i in range(1000):
        path = root / (base if i == 0 else f"{base}_{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot make a unique run folder under {root}")


def write_config(cfg: DictConfig, run_dir: Path) -> Path:
    path = run_dir / "config.yaml"
    atomic_write_text(path, OmegaConf.to_yaml(cfg, resolve=True))
    return path
