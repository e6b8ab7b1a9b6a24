"""launcher=local for real: torchrun restarts a failed worker group and the run resumes
from the last checkpoint (launcher.max_restarts)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import PY, child_env, describe, run_cli, run_dir_of, summary

pytestmark = [pytest.mark.dist, pytest.mark.slow]


def test_restart_resumes_from_checkpoint(tmp_path):
    # rank 1 dies after epoch 1 on the first attempt only; torchrun restarts the group once
    env = {"DDP_LAB_FAIL_ONCE": "rank=1,epoch=1"}
    proc = run_cli("launcher.nproc_per_node=2", "launcher.max_restarts=1", "train.epochs=2",
                   "train.max_steps_per_epoch=10", "log.progress=lines",
                   f"run.root={tmp_path / 'runs'}", f"data.root={tmp_path / 'data'}",
                   cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, describe(proc)
    run_dir = run_dir_of(proc)
    s = summary(run_dir)
    assert s["status"] == "completed" and s["world_size"] == 2
    assert s["start_epoch"] == 1 and s["epochs_run"] == 1  # epoch 2 only: epoch 1 was resumed
    assert "resumed from epoch_0001.pt" in proc.stdout
    epochs = [json.loads(ln)["epoch"] for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2]
    assert "DDP_LAB_FAIL_ONCE: rank 1 exits after epoch 1" in (run_dir / "logs" / "rank1.log").read_text()


def test_failure_without_restarts_fails_the_run_and_the_console_ends_with_why(tmp_path, shared_data_root):
    """The console (stdout and stderr as a terminal shows them) ends with ddp_lab's
    diagnosis and the run folder; torchrun's ChildFailedError traceback is in
    logs/torchrun.log only, and the console says where."""
    env = {"DDP_LAB_FAIL_ONCE": "rank=1,epoch=1"}
    args = ["launcher.nproc_per_node=2", "train.epochs=2", "train.max_steps_per_epoch=5",
            "log.progress=lines", f"run.root={tmp_path / 'runs'}",
            f"data.root={shared_data_root}", "dist.timeout_s=30"]
    proc = subprocess.run([PY, "-m", "ddp_lab", *args], cwd=tmp_path, env=child_env(env),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    console = proc.stdout
    assert proc.returncode == 1, console
    last = console.rstrip().splitlines()[-3:]
    run_dir = Path(last[-1].removeprefix("run dir: "))
    assert summary(run_dir)["status"].startswith("failed: rank 1 ")
    assert last[1].startswith("job failed with exit status 1: rank 1 "), console
    assert "dead (no process)" in last[1] and f"(logs in {run_dir / 'logs'})" in last[1], console
    log = run_dir / "logs" / "torchrun.log"
    assert last[0] == (f"[torchrun] ddp_lab.worker failed: rank 1 first (exit code 17), "
                       f"2 process(es) in all; torchrun's traceback: {log}"), console
    assert "Traceback" not in console and "ChildFailedError" not in console, console
    assert "[rank 0] epoch 1/2" in console  # the ranks' own lines still reach the console
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "ChildFailedError" in text, text
    assert "Root Cause" in text and "exitcode  : 17" in text, text
