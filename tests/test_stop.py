"""The stop agreement (ddp_lab/rank/epochs.py) on real gloo worlds: whichever rank gets the signal
(or the stop file), every rank stops after the same step, and the adaptive check interval
is the same on every rank."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from helpers import run_world


def _ctx():
    import torch

    from ddp_lab.world.distributed import DistContext
    from ddp_lab.world.env import detect_env

    return DistContext(env=detect_env(), backend="gloo", device=torch.device("cpu"))


def _loop(rank, world, run_dir, trigger, at_step, check_s):
    from ddp_lab.folder.rundir import request_stop
    from ddp_lab.rank.epochs import StopControl

    stopper = StopControl(_ctx(), Path(run_dir), "SIGUSR2", check_s)
    everies = []
    try:
        for step in range(1, 5000):
            time.sleep(0.001)  # a "step"
            if step == at_step and rank == world - 1:
                if trigger == "file":
                    request_stop(Path(run_dir), "preempted", "test")
                else:
                    os.kill(os.getpid(), getattr(signal, trigger))
            info = stopper.step()
            everies.append(stopper.every)
            if info is not None:
                return step, info.status, info.reason, everies, stopper.checks
        return None, None, None, everies, stopper.checks
    finally:
        stopper.restore()


@pytest.mark.dist
@pytest.mark.parametrize("trigger, status", [("SIGUSR2", "preempted"), ("SIGTERM", "preempted"),
                                             ("SIGINT", "stopped"), ("file", "preempted")])
def test_every_rank_stops_after_the_same_step(tmp_path, trigger, status):
    out = run_world(_loop, 3, str(tmp_path), trigger, 40, 0.05)
    steps = {o[0] for o in out}
    assert len(steps) == 1 and None not in steps  # the same step on every rank
    assert steps.pop() >= 40
    assert {o[1] for o in out} == {status}
    assert all(o[3] == out[0][3] for o in out)  # the same check schedule everywhere
    if trigger != "file":
        assert f"{trigger} on rank 2" in out[0][2]


@pytest.mark.dist
def test_checks_space_out_to_the_asked_interval(tmp_path):
    """~1 ms steps and check_s=0.05: the interval grows to tens of steps, so a run of
    ~400 steps makes far fewer checks than steps."""
    out = run_world(_loop, 2, str(tmp_path), "file", 400, 0.05)
    step, _, _, everies, checks = out[0]
    assert step >= 400
    assert max(everies) >= 8 and checks < step / 5


@pytest.mark.parametrize("status, rc", [("completed", 0), ("stopped", 128 + signal.SIGTERM)])
def test_a_sigterm_after_the_last_epoch_leaves_the_run_completed(tmp_path, status, rc):
    """SIGTERM to `python -m ddp_lab` while its job tears down after the last epoch: the
    ranks wrote `completed` and the job ends 0, so the command says 0 and leaves no stop
    request behind; a job that stopped on it (summary `stopped`) still ends 128 + SIGTERM.
    A real job stand-in (a shell that writes the summary, then takes 1.5 s to end) and a
    real signal to this process, where Foreground's handler runs."""
    import json
    import threading

    from ddp_lab.launch.local import run_foreground

    summary = tmp_path / "summary.json"
    script = tmp_path / "job.sh"
    script.write_text(f"echo '{json.dumps({'status': status})}' > {summary}\nsleep 1.5\n")
    timer = threading.Timer(0.7, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        got = run_foreground(["bash", str(script)], tmp_path, grace_s=30)
    finally:
        timer.cancel()
    assert json.loads(summary.read_text())["status"] == status
    assert got == rc
    assert (tmp_path / "STOP").exists() == (status != "completed")


def test_a_job_past_its_limit_is_ended_with_what_it_started(tmp_path):
    """launch_job's limit_s (the doctor's bound on its whole job): a job whose ranks never
    start reaches none of their own timeouts. A real job stand-in that never ends, with a
    child in its process group: ended after limit_s with 124, as timeout(1) ends one, and
    neither process is left."""
    from ddp_lab.launch.local import OVER_LIMIT, run_foreground

    pids = tmp_path / "pids"
    script = tmp_path / "job.sh"
    script.write_text(f"sleep 600 & echo $$ $! > {pids}\nwait\n")
    t0 = time.monotonic()
    got = run_foreground(["bash", str(script)], tmp_path, grace_s=30, limit_s=2)
    took = time.monotonic() - t0
    assert got == OVER_LIMIT == 124
    assert 2 <= took < 30, took
    for pid in map(int, pids.read_text().split()):
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", pid
