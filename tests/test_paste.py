"""Commands ddp_lab prints for the user to paste run as printed (ddp_lab/command/paste.py,
docs/status.md): the command that continues a stopped run carries every override the run
started with, shell-quoted; a reused run folder names every setting that differs in one
refusal. (A launcher whose tool is missing: tests/test_launch_render.py,
test_cli_missing_tool.)"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from helpers import PY, child_env, compose, describe, run_cli, summary

from ddp_lab.command.paste import COMMAND_FILE, continue_command, started_with
from ddp_lab.folder.rundir import write_config
from ddp_lab.launch import job_processes, sweep


def test_continue_command_carries_every_override_quoted(tmp_path):
    run = tmp_path / "a run"  # a space: quoted too
    run.mkdir()
    (run / COMMAND_FILE).write_text(
        "python -m ddp_lab sync=ring 'model.hidden=[64,32]' launcher.dry_run=true "
        "train.resume=true 'run.dir=/elsewhere' 'launcher.setup=[echo \"a b\"]'\n")
    assert started_with(run)[:2] == ["sync=ring", "model.hidden=[64,32]"]
    cmd = continue_command(run, "slurm")
    assert shlex.split(cmd) == ["python", "-m", "ddp_lab", f"run.dir={run}", "sync=ring",
                                "model.hidden=[64,32]", 'launcher.setup=[echo "a b"]'], cmd
    # a folder without the file (a study's point): its launcher at least
    bare = tmp_path / "bare"
    bare.mkdir()
    assert continue_command(bare, "slurm") == f"python -m ddp_lab run.dir={bare} launcher=slurm"


def test_a_reused_folder_names_every_difference_at_once(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "epoch_0001.pt").write_bytes(b"")  # only its name is read
    write_config(compose("sync=ring", "sync.bucket_mb=4", "train.lr=0.01", "train.epochs=3",
                         f"run.dir={run_dir}"), run_dir)
    proc = run_cli(f"run.dir={run_dir}", "sync=ring", "sync.bucket_mb=8", "model=cnn",
                   "train.lr=0.02", "train.epochs=3", "launcher.dry_run=true", cwd=tmp_path,
                   timeout=120)
    assert proc.returncode == 2, describe(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "(3 differ)" in lines[0], describe(proc)
    for said in ("sync.bucket_mb=4 (this command: 8)", "model=mlp (this command: cnn)",
                 "train.lr=0.01 (this command: 0.02)"):
        assert said in lines[0], lines[0]


def _one_run(root: Path, proc: subprocess.Popen, timeout: float = 180) -> Path:
    """The run folder the command made under `root`, once its ranks say they run."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for path in root.glob("*/summary.json") if root.is_dir() else ():
            try:
                if json.loads(path.read_text()).get("status") == "running":
                    return path.parent
            except ValueError:
                pass
        assert proc.poll() is None, f"the run ended before it ran (rc {proc.returncode})"
        time.sleep(0.3)
    raise AssertionError(f"no run started under {root} within {timeout} s")


@pytest.mark.slow
@pytest.mark.dist
def test_the_printed_continue_command_runs_as_printed(tmp_path, shared_data_root):
    """A run with three overrides, stopped from another shell: both the command's and
    status's "continue with" are the same line, and that line, split as a shell splits it
    and run, exits 0 and finishes the run."""
    root = tmp_path / "runs"
    three = ["sync=ring", "optim=sgd", "model.hidden=[64,32]"]
    # 10 ms a step on rank 1 (all wait for it): the stop lands well before the end
    common = ["launcher.nproc_per_node=2", "train.epochs=2", "train.max_steps_per_epoch=300",
              "train.eval_batch_size=2000", "log.progress=lines", "debug.slow_rank=1",
              "debug.slow_ms=10", f"data.root={shared_data_root}", f"run.root={root}"]
    console = tmp_path / "first.console"
    with open(console, "w") as log:
        proc = subprocess.Popen([PY, "-m", "ddp_lab", *three, *common], cwd=tmp_path,
                                env=child_env(), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    run_dir = None
    try:
        run_dir = _one_run(root, proc)
        stop = run_cli(str(run_dir), "--stop", "--timeout", "120", module="ddp_lab.status",
                       cwd=tmp_path, timeout=200)
        assert stop.returncode == 0, describe(stop)
        assert proc.wait(timeout=60) == 75, console.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if run_dir is not None:
            sweep(run_dir)
    assert summary(run_dir)["status"] == "stopped"

    def after(text: str, heading: str) -> str:
        lines = text.splitlines()
        i = next(i for i, x in enumerate(lines) if x.startswith(heading))
        return lines[i + 1].strip()

    printed = after(stop.stdout, "[status] continue with:")
    assert printed == after(console.read_text(), "Continue with ("), console.read_text()[-3000:]
    assert "'model.hidden=[64,32]'" in printed, printed  # quoted: a shell's glob leaves it be

    # exactly what was printed, `python` being this venv's
    env = child_env({"PATH": f"{os.path.dirname(PY)}{os.pathsep}{os.environ['PATH']}"})
    again = subprocess.run(shlex.split(printed), cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300, stdin=subprocess.DEVNULL)
    try:
        assert again.returncode == 0, describe(again)
    finally:
        sweep(run_dir)
    s = summary(run_dir)
    assert s["status"] == "completed" and s["epochs_done"] == 2, s
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (cfg["sync"]["name"], cfg["optim"]["name"], cfg["model"]["hidden"]) == \
        ("ring", "sgd", [64, 32])
    assert job_processes(run_dir) == []
