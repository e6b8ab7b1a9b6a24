"""`python -m ddp_lab.status`: reattach to a run from another shell (real runs, real
processes): its state while it runs, --follow to its end, --stop (checkpoint first) and
resume, a folder of runs, bad input; and a SLURM job on the loopback cluster."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from helpers import PY, child_env, describe, run_cli, summary

from ddp_lab.launch import job_processes, sweep

# whole epochs (469 steps, ~2-4 s each here): long enough to catch the run running
LONG = ["train.eval_batch_size=2000", "log.progress=lines", "launcher.nproc_per_node=2"]


def status(*args: str, cwd: Path, env=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_cli(*map(str, args), cwd=cwd, env=env, timeout=timeout, module="ddp_lab.status")


def start_run(tmp_path: Path, run_dir: Path, *overrides: str) -> subprocess.Popen:
    """`python -m ddp_lab run.dir=RUN ...` in the background, as from a shell about to close."""
    with open(tmp_path / f"{run_dir.name}.console", "a") as log:  # the child keeps its copy
        return subprocess.Popen([PY, "-m", "ddp_lab", f"run.dir={run_dir}", *overrides],
                                cwd=tmp_path, env=child_env(), stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def wait_running(run_dir: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if json.loads((run_dir / "summary.json").read_text()).get("status") == "running":
                return
        except (OSError, ValueError):
            pass
        assert proc.poll() is None, f"the run ended before it ran (rc {proc.returncode})"
        time.sleep(0.3)
    raise AssertionError(f"{run_dir} did not start running within {timeout} s")


def end(proc: subprocess.Popen, run_dir: Path) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)
    sweep(run_dir)


# ------------------------------------------------------------------ bad input
def test_bad_input_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "empty").mkdir()
    for run in ("r1", "r2"):
        (tmp_path / "two" / run).mkdir(parents=True)
        (tmp_path / "two" / run / "config.yaml").write_text("launcher:\n  name: local\n")
    cases = [([tmp_path / "nowhere"], "no such folder"),
             ([tmp_path / "a_file"], "is a file"),
             ([tmp_path / "empty"], "holds no run folder"),
             ([tmp_path / "two", "--follow"], "--follow takes one run folder"),
             ([tmp_path / "two" / "r1", "--stop", "--json"], "--json shows the state only"),
             ([tmp_path / "two", "--bogus"], "unrecognized arguments: --bogus"),
             ([], "RUN_DIR")]
    for args, words in cases:
        proc = status(*args, cwd=tmp_path)
        assert proc.returncode == 2, (args, describe(proc))
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
        assert words in proc.stderr and proc.stdout == "", (args, proc.stderr)


def test_a_run_that_never_started_and_a_dead_one(tmp_path, shared_data_root):
    # a dry run: config.yaml and launch.sh, nothing else; then summary.json claiming
    # `running` with nothing alive (as after a SIGKILL of every process of the job)
    proc = run_cli(f"run.dir={tmp_path / 'dry'}", "launcher.dry_run=true",
                   f"data.root={shared_data_root}", cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    out = status(tmp_path / "dry", cwd=tmp_path)
    assert out.returncode == 0 and "state:       dry run (rendered by" in out.stdout, describe(out)
    out = status(tmp_path, cwd=tmp_path)  # a dry run is no run: not counted (issue 21)
    assert out.returncode == 2 and "holds only dry runs (1)" in out.stderr, describe(out)
    (tmp_path / "dry" / "DRY_RUN").unlink()  # launched, as far as the folder tells
    out = status(tmp_path / "dry", cwd=tmp_path)
    assert out.returncode == 0 and "state:       not started" in out.stdout, describe(out)
    (tmp_path / "dry" / "summary.json").write_text(json.dumps(
        {"status": "running", "epochs_done": 1, "step_in_epoch": 0, "epochs": 3}))
    out = status(tmp_path / "dry", cwd=tmp_path)
    assert "running (no process alive: the job died without a word)" in out.stdout, describe(out)
    assert "continue:    python -m ddp_lab run.dir=" in out.stdout
    assert json.loads(status(tmp_path / "dry", "--json", cwd=tmp_path).stdout)["dead"] is True
    follow = status(tmp_path / "dry", "--follow", cwd=tmp_path, timeout=60)
    assert follow.returncode == 1, describe(follow)


def test_a_pod_whose_python_lacks_ddp_lab_is_a_failure_with_its_reason(tmp_path):
    """A RunAI pod's image without ddp_lab: the pod script's check says so in its log, and
    status shows that line, not 'not started'."""
    proc = run_cli(f"run.dir={tmp_path / 'run'}", "launcher=runai", "launcher.dry_run=true",
                   cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    (tmp_path / "run" / "logs").mkdir(exist_ok=True)
    (tmp_path / "run" / "logs" / "pod0.log").write_text(
        "[pod 0/2] 10:00:01 pod-0: master pod-0:23456, 4 process(es)\n"
        "[ddp_lab] /usr/bin/python cannot import hydra, omegaconf, ddp_lab: install them for "
        "that python\n[pod 0/2] 10:00:02 exit status 3\n")
    out = status(tmp_path / "run", cwd=tmp_path)
    assert ("state:       failed (/usr/bin/python cannot import hydra, omegaconf, ddp_lab: "
            "install them for that python (pod0.log))") in out.stdout, describe(out)


# ------------------------------------------------------------------ local runs
@pytest.mark.slow
@pytest.mark.dist
def test_local_run_status_stop_follow_resume(tmp_path, shared_data_root):
    run_dir = tmp_path / "runs" / "a"
    # 5 ms a step on rank 1 (all wait for it at the sync): ~2.5 s more an epoch, so the stop
    # lands epochs before the end and the resumed run still trains while --follow attaches
    # (without it, a CI run's stop landed in the last epoch and left the resume 1 s, over
    # before --follow started)
    overrides = ["train.epochs=5", "debug.slow_rank=1", "debug.slow_ms=5", *LONG,
                 f"data.root={shared_data_root}"]
    proc = start_run(tmp_path, run_dir, *overrides)
    try:
        wait_running(run_dir, proc)
        out = status(run_dir, cwd=tmp_path)
        assert out.returncode == 0, describe(out)
        assert "state:       running (" in out.stdout and "/5 epochs" in out.stdout, out.stdout
        assert "process(es) alive" in out.stdout and "allocation 1: running" in out.stdout

        stop = status(run_dir, "--stop", "--timeout", "120", cwd=tmp_path, timeout=200)
        assert stop.returncode == 0, describe(stop)
        assert "[status] stopped after" in stop.stdout, stop.stdout
        assert f"continue with:\n  python -m ddp_lab run.dir={run_dir} " in stop.stdout
        assert proc.wait(timeout=60) == 75  # the submitting shell's view: stopped gracefully
        s = summary(run_dir)
        assert s["status"] == "stopped" and "ddp_lab.status --stop" in s["stop_reason"], s
        assert list((run_dir / "checkpoints").glob("epoch_*.pt"))
        assert job_processes(run_dir) == []
        out = status(run_dir, cwd=tmp_path)
        assert "state:       stopped" in out.stdout, out.stdout
    finally:
        end(proc, run_dir)

    # resumed in the background, followed from another process to its end
    proc = start_run(tmp_path, run_dir, *overrides)
    try:
        wait_running(run_dir, proc)
        follow = status(run_dir, "--follow", cwd=tmp_path, timeout=300)
        assert follow.returncode == 0, describe(follow)
        assert "epoch 5/5" in follow.stdout, follow.stdout  # the log, as it grew
        last = follow.stdout.rstrip().splitlines()[-1]
        assert last.startswith("[status] completed after 5/5 epochs, test accuracy"), last
        assert proc.wait(timeout=60) == 0
    finally:
        end(proc, run_dir)
    out = status(run_dir, cwd=tmp_path)
    assert "state:       completed" in out.stdout and "5/5 epochs" in out.stdout, out.stdout
    assert "allocation 2: completed" in out.stdout

    # a folder of a run and a dry run: one line for the run, then a count that leaves the
    # dry run out and says so (issue 21)
    dry = run_cli(f"run.dir={tmp_path / 'runs' / 'b'}", "launcher.dry_run=true",
                  f"data.root={shared_data_root}", cwd=tmp_path)
    assert dry.returncode == 0, describe(dry)
    out = status(tmp_path / "runs", cwd=tmp_path)
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 0 and len(lines) == 2, out.stdout
    assert lines[0].startswith("a ") and "completed" in lines[0] and "5/5 epochs" in lines[0]
    assert "1 run(s) under" in lines[1] and "1 completed (1 dry run(s) not counted)" in lines[1]


# ------------------------------------------------------------------ SLURM
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.dist
def test_slurm_job_status_and_stop(slurm_cluster, tmp_path, shared_data_root):
    env = slurm_cluster.env
    run_dir = tmp_path / "run"
    sub = run_cli("launcher=slurm", "launcher.nodes=2", "launcher.nproc_per_node=1",
                  "launcher.wait=false", "train.epochs=20", "train.eval_batch_size=2000",
                  "log.progress=lines", f"run.dir={run_dir}", f"data.root={shared_data_root}",
                  cwd=tmp_path, env=env, timeout=120)
    assert sub.returncode == 0, describe(sub)
    job_id = (run_dir / "job_id").read_text().strip()
    try:
        deadline, info = time.monotonic() + 240, {}
        while time.monotonic() < deadline:
            info = json.loads(status(run_dir, "--json", cwd=tmp_path, env=env).stdout)
            if info["state"] == "running":
                break
            assert info["state"] == "pending", info
            time.sleep(1)
        assert info["state"] == "running" and info["job_id"] == job_id, info
        assert info["scheduler"]["state"] == "RUNNING", info
        out = status(run_dir, cwd=tmp_path, env=env)
        assert f"job {job_id}: scheduler says RUNNING" in out.stdout, out.stdout
        assert f"ddp_lab_{job_id}.out" in out.stdout  # the scheduler's log, for tail -f

        # one shell follows it (through scontrol), another stops it
        follow = subprocess.Popen([PY, "-m", "ddp_lab.status", str(run_dir), "--follow"],
                                  cwd=tmp_path, env=child_env(env), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        stop = status(run_dir, "--stop", "--timeout", "120", cwd=tmp_path, env=env, timeout=200)
        followed = follow.communicate(timeout=120)[0]
        assert follow.returncode == 75, followed  # stopped: continue it later
        assert "[rank 0] stop requested" in followed and "[status] stopped after" in followed
        assert stop.returncode == 0, describe(stop)
        assert f"scancel {job_id}" in stop.stdout or f"SLURM job {job_id} ended by itself" \
            in stop.stdout, stop.stdout
        s = summary(run_dir)
        assert s["status"] == "stopped" and s["job_id"] == job_id, s
        assert list((run_dir / "checkpoints").glob("epoch_*.pt"))
        out = status(run_dir, cwd=tmp_path, env=env)
        assert "state:       stopped" in out.stdout and "scheduler says RUNNING" not in out.stdout
        assert "sbatch" in out.stdout  # how to continue it
    finally:
        subprocess.run(["scancel", job_id], env=env, timeout=30)
        if "follow" in locals() and follow.poll() is None:
            follow.kill()


@pytest.mark.cluster
@pytest.mark.slow
def test_slurm_pending_job_is_shown_then_cancelled(slurm_cluster, tmp_path):
    env = slurm_cluster.env
    run_dir = tmp_path / "run"
    sub = run_cli("launcher=slurm", "launcher.wait=false", "launcher.sbatch_extra=['--begin=now+3600']",
                  f"run.dir={run_dir}", f"data.root={tmp_path / 'data'}",
                  cwd=tmp_path, env=env, timeout=120)
    assert sub.returncode == 0, describe(sub)
    job_id = (run_dir / "job_id").read_text().strip()
    try:
        out = status(run_dir, cwd=tmp_path, env=env)
        assert f"state:       pending (SLURM job {job_id} PENDING (BeginTime))" in out.stdout, out.stdout
        stop = status(run_dir, "--stop", cwd=tmp_path, env=env)
        assert stop.returncode == 0 and f"scancel {job_id}" in stop.stdout, describe(stop)
        state = slurm_cluster.run("scontrol", "show", "job", "-o", job_id).stdout
        assert "JobState=CANCELLED" in state, state
        one = status(tmp_path, cwd=tmp_path, env=env).stdout.splitlines()[0]
        assert one.startswith("run ") and "[CANCELLED]" in one and job_id in one, one
    finally:
        subprocess.run(["scancel", job_id], env=env, timeout=30)
