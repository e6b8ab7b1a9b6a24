"""What a healthy run prints (docs/timing.md, "The console"): no line of torch.profiler's
own C++ logging (Kineto: `ERROR: ... gpuGetDeviceCount failed with code 35` on a CUDA build
without a driver, `USDT: ... profiler_start`), epochs counted from 1 everywhere, and the
key to the epoch line before any line that reads with it."""

from __future__ import annotations

import re

import pytest

from helpers import run_cli, run_dir_of, describe

# Kineto's own line: `LEVEL:YYYY-mm-dd HH:MM:SS pid:tid File.cpp:NN] ...`
KINETO_LINE = re.compile(r"^(VERBOSE|INFO|WARNING|STAGE|ERROR|USDT):\d{4}-\d\d-\d\d ", re.M)


@pytest.mark.dist
@pytest.mark.slow
def test_a_profiled_cpu_run_is_quiet_and_counts_epochs_from_one(tmp_path, shared_data_root):
    # a straggler injected, so its line is on the console to be ordered after the key
    proc = run_cli("launcher.nproc_per_node=2", "train.epochs=1", "train.max_steps_per_epoch=40",
                   "train.eval_batch_size=2000", "train.checkpoint=false", "log.progress=lines",
                   "timing.profile=true", "debug.slow_rank=1", "debug.slow_ms=40",
                   f"data.root={shared_data_root}", f"run.root={tmp_path / 'runs'}",
                   cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, describe(proc)
    console = proc.stdout + proc.stderr
    assert not KINETO_LINE.search(console), describe(proc)
    assert "ERROR" not in console and "USDT" not in console, describe(proc)
    run_dir = run_dir_of(proc)
    assert (run_dir / "profile" / "rank0.pt.trace.json").is_file()  # the profiler did run

    lines = proc.stdout.splitlines()
    key = next(i for i, x in enumerate(lines) if x.startswith("[rank 0] (loss, acc:"))
    epoch = next(i for i, x in enumerate(lines) if x.startswith("[rank 0] epoch 1/1  loss"))
    straggler = [i for i, x in enumerate(lines) if "straggler: rank 1" in x]
    assert straggler, describe(proc)
    assert key < epoch < straggler[0], describe(proc)
    assert lines[straggler[0]].startswith("[rank 0] epoch 1/1  straggler:")

    status = run_cli(str(run_dir), module="ddp_lab.status", cwd=tmp_path, timeout=120)
    assert "last epoch:  1: train loss" in status.stdout, describe(status)  # 1-based as well


def test_status_names_a_ranks_epoch_from_one():
    """A rank's heartbeat record counts epochs done (0 while it runs its first epoch):
    status shows the epoch it is in, as the console does (`epoch 1`)."""
    from ddp_lab.command.status import render
    from ddp_lab.folder.heartbeat import where

    rank = {"rank": 0, "epoch": 0, "step": 11, "phase": "sync", "collective": 7, "op": "all_reduce",
            "age_s": 1.0}
    rank["where"] = where(rank)
    info = {"run_dir": "/r", "state": "running", "detail": "", "stop_requested": None,
            "stop_reason": None, "epochs_done": 0, "step_in_epoch": 11, "epochs": 5,
            "checkpoint": None, "last_epoch": None, "launcher": "local", "job_id": None,
            "scheduler": None, "processes": [], "host": "h", "ranks": [rank], "segments": [],
            "logs": ["/r/logs/rank0.log"], "dead": False}
    text = render(info)
    assert "rank 0 at epoch 1 step 12 phase sync" in text, text
    assert "epoch 0" not in text, text


def test_status_says_an_allocations_span_in_epochs_done():
    from ddp_lab.command.status import _segment

    seg = {"status": "completed", "launcher": "local", "hosts": ["h"], "nodes": 1, "world_size": 2,
           "start": "a", "end": "b", "start_epoch": 0, "start_step": 0, "end_epoch": 2, "end_step": 0}
    assert _segment(seg).endswith("from the start to 2 epoch(s) done"), _segment(seg)
    seg.update(start_epoch=2, start_step=40, end_epoch=5)
    assert _segment(seg).endswith("from 2 epoch(s) + 40 steps done to 5 epoch(s) done")
