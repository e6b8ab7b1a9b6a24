"""launcher=local for real: torchrun restarts a failed worker group and the run resumes
from the last checkpoint (launcher.max_restarts)."""

from __future__ import annotations

import json

import pytest
from helpers import describe, run_cli, run_dir_of, summary

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


def test_failure_without_restarts_fails_the_run(tmp_path):
    env = {"DDP_LAB_FAIL_ONCE": "rank=1,epoch=1"}
    proc = run_cli("launcher.nproc_per_node=2", "train.epochs=2", "train.max_steps_per_epoch=5",
                   "log.progress=lines", f"run.root={tmp_path / 'runs'}",
                   f"data.root={tmp_path / 'data'}", "dist.timeout_s=30",
                   cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode != 0, describe(proc)
    run_dir = run_dir_of(proc)
    assert summary(run_dir)["status"].startswith("failed")
    assert "job failed with exit status" in proc.stdout
