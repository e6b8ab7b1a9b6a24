"""The commands ddp_lab prints for the user to paste, made so they run as printed.

A training run's folder keeps the command that last ran it (`command.txt`, shell-quoted). The
command that continues the run is that one with `run.dir=` the folder: every setting the run
started with, so the folder's checks (rundir.reuse_problem) find nothing changed
(tests/test_paste.py runs it exactly as printed).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Iterable, Optional

COMMAND_FILE = "command.txt"
PROGRAM = "python -m ddp_lab"
# how one command ran, not what the run is: the command that continues it sets its own
NOT_CARRIED = ("run.dir", "train.resume", "launcher.dry_run")


def job_overrides() -> Optional[list[str]]:
    """The overrides of the Hydra job running now (a -m sweep's job: its own values); None outside
    Hydra (a test calling submit with a composed config)."""
    from hydra.core.hydra_config import HydraConfig

    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return None


def command_line(overrides: Iterable[str]) -> str:
    """`python -m ddp_lab` and `overrides`, each a shell word as it is or quoted."""
    return " ".join([PROGRAM, *(shlex.quote(str(o)) for o in overrides)])


def started_with(run_dir: Path) -> Optional[list[str]]:
    """The overrides of the command in the folder's command.txt; None without one (a study's point,
    a folder from before the file)."""
    try:
        words = shlex.split((Path(run_dir) / COMMAND_FILE).read_text())
    except (OSError, ValueError):
        return None
    program = PROGRAM.split()
    return words[len(program):] if words[:len(program)] == program else None


def override_key(override: str) -> str:
    """The key an override sets (`+train.epochs=3` -> train.epochs)."""
    return override.lstrip("+~").partition("=")[0]


def continue_command(run_dir: Path, launcher: Optional[str] = None) -> str:
    """The command that continues the run in `run_dir`: run.dir and every override it was started
    with (`launcher` alone where the folder does not say them)."""
    overrides = started_with(run_dir)
    if overrides is None:
        overrides = [f"launcher={launcher}"] if launcher and launcher != "local" else []
    kept = [o for o in overrides if override_key(o) not in NOT_CARRIED]
    return command_line([f"run.dir={run_dir}", *kept])
