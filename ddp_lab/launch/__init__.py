"""Launchers: render what will run into the run folder, then start it and follow it. Each (local,
mpirun, slurm, runai) has `resolve(cfg)` (fill its derived settings, reject bad input with a
`LaunchError` before the run folder exists) and `render(cfg, run_dir) -> Rendered` (pure: the files
and the command; `Rendered.starter`, when set, starts and follows the job). Templates live in
`launchers/`, filled with `str.format`.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Optional

from ..config.registry import Registry
from . import local, mpirun, runai, slurm
from .base import LaunchError, Rendered, require_tool
from .local import job_processes, run_foreground, sweep  # noqa: F401 (the launch API: tests, status)

# launcher option -> its module; its get(name): an UnknownName lists the valid ones
LAUNCHERS: Registry[ModuleType] = Registry("launcher", {
    "local": local, "mpirun": mpirun, "slurm": slurm, "runai": runai})


def resolve(cfg) -> None:
    """Fill cfg.launcher's derived settings in place (cfg must be open for new keys)."""
    LAUNCHERS.get(cfg.launcher.name).resolve(cfg)


def check_tool(cfg) -> None:
    """The launcher's own tool (sbatch, mpirun, runai) on PATH, for a real start: a LaunchError in
    one line, before any run folder or "starting" line. A dry run needs none."""
    mod = LAUNCHERS.get(cfg.launcher.name)
    if not cfg.launcher.get("dry_run") and hasattr(mod, "tool"):
        require_tool(*mod.tool(cfg))


def render(cfg, run_dir: Path) -> Rendered:
    return LAUNCHERS.get(cfg.launcher.name).render(cfg, run_dir)


def start(rendered: Rendered, run_dir: Path, grace_s: float = 120.0,
          limit_s: Optional[float] = None) -> int:
    """Start the job and follow it to its end; its exit status is ours. `limit_s`: a job run in
    the foreground (local, mpirun) still running that long is ended (`run_foreground`); a
    scheduler's is followed for launcher.wait_timeout_s."""
    if rendered.starter is not None:
        return rendered.starter(limit_s)
    return run_foreground(rendered.command, run_dir, grace_s, limit_s=limit_s)
