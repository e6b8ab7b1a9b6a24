"""Helpers for the launcher tests: compose a config in-process, run `python -m ddp_lab` as a
subprocess that imports *this* checkout, read a run folder back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
# small and fast: the launchers are under test here, not the training
QUICK = ["train.epochs=1", "train.max_steps_per_epoch=20", "train.eval_batch_size=2000",
         "log.progress=lines"]


def child_env(extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None) -> dict:
    """The environment for `python -m ddp_lab`: this checkout first on PYTHONPATH, so the
    submitting process and every rank it starts import the code under test."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("DDP_LAB_FAIL_ONCE", None)
    env.update(extra or {})
    return env


def run_cli(args: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None,
            timeout: float = 300, stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "ddp_lab", *args], cwd=cwd, env=dict(env or child_env()),
                          capture_output=True, text=True, timeout=timeout, stdin=stdin)


def run_dir_of(proc: subprocess.CompletedProcess) -> Path:
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("run dir: ")]
    assert lines, f"no 'run dir:' line\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert proc.stdout.rstrip().splitlines()[-1] == lines[-1], "run dir must be the last line"
    return Path(lines[-1].removeprefix("run dir: "))


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def describe(proc: subprocess.CompletedProcess) -> str:
    return f"rc={proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"


def compose(overrides: Sequence[str]):
    """The config `python -m ddp_lab <overrides>` would compose."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from ddp_lab.config import CONF_DIR, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(config_name="config", overrides=list(overrides))
