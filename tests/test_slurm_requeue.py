"""Stop, checkpoint, requeue, resume on the real loopback SLURM cluster (2 nodes x 1 process).

`python -m ddp_lab launcher=slurm launcher.wait=true` submits and follows each job, as a
user runs it; meanwhile the test plays the scheduler's part:
- the time-limit signal: `scancel --signal=USR2 --batch <id>` reaches the batch shell alone,
  as `#SBATCH --signal=B:USR2@N` does; the job checkpoints mid-epoch and requeues itself
  (here onto 1 node after 2: strong scaling, within 1e-5 of a 1-node run);
- an admin's `scontrol requeue <id>`: SIGTERM to the batch shell and every process (SIGKILL
  KillWait=5 s later on this cluster); the ranks checkpoint, the job comes back with
  SLURM_RESTART_COUNT=1 and resumes by itself;
- a real wall-clock limit: seed 002's two minutes, stopped near its end, requeued, completed.
A requeued job waits ~150 s in PENDING (Reason=BeginTime) here: the test releases it with
`scontrol update JobId=N StartTime=now`. Every run ends with each epoch once in
metrics.jsonl and one summary.json segment per allocation; the admin's requeue ends bit for
bit where an uninterrupted run of the same world size ends (run locally: the same gloo world).
"""

from __future__ import annotations

import datetime
import json
import subprocess
import time
from pathlib import Path

import pytest
import torch
from helpers import PY, child_env, summary

pytestmark = [pytest.mark.cluster, pytest.mark.dist]

# 3 x 469 steps: ~6 s of training on an idle 2-core machine (4 ms a step on 2 loopback
# nodes), up to ~20 s on a loaded one: long enough to stop it mid-epoch, which takes ~2 s
# (the signal, the stop file, the next stop check); 2 x 100 steps ended before the stop
EPOCHS, STEPS = 3, 469
TRAIN = [f"train.epochs={EPOCHS}", f"train.max_steps_per_epoch={STEPS}",
         "train.eval_batch_size=2000", "log.progress=lines", "launcher.nodes=2",
         "launcher.nproc_per_node=1"]
FOLLOW = ["launcher.wait=true", "launcher.wait_timeout_s=400", "launcher.poll_s=1"]


class Job:
    """`python -m ddp_lab launcher=slurm ... launcher.wait=true` running in the background."""

    def __init__(self, cluster, run_dir: Path, data_root: Path, *overrides: str):
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        self.cluster, self.run_dir = cluster, run_dir
        self.log = run_dir.parent / f"{run_dir.name}.console"
        self._out = open(self.log, "w")
        self.proc = subprocess.Popen(
            [PY, "-m", "ddp_lab", "launcher=slurm", *TRAIN, *FOLLOW, *overrides,
             f"run.dir={run_dir}", f"data.root={data_root}"],
            cwd=run_dir.parent, env=child_env(cluster.env), stdout=self._out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
        self.released = 0
        self._pending_since: float | None = None

    @property
    def job_id(self) -> str:
        path = self.run_dir / "job_id"
        deadline = time.monotonic() + 120
        while not (path.is_file() and path.read_text().strip()):
            assert self.proc.poll() is None, f"no job submitted\n{self.console()}"
            assert time.monotonic() < deadline, f"no job id after 120 s\n{self.console()}"
            time.sleep(0.3)
        return path.read_text().strip()

    def console(self) -> str:
        # whole: torch's elastic agent can put pages of C++ frames after the lines asserted
        # on (node 2's exit barrier when node 1 ends first), and a tail once lost the requeue's
        return self.log.read_text(errors="replace")

    def job_log(self) -> str:
        return (self.run_dir / "logs" / f"ddp_lab_{self.job_id}.out").read_text(errors="replace")

    def scontrol(self) -> dict:
        res = self.cluster.run("scontrol", "show", "job", "-o", self.job_id, check=False)
        return dict(tok.split("=", 1) for tok in res.stdout.split() if "=" in tok)

    def wait_training(self, timeout: float = 150) -> None:
        """Until rank 0 of the current allocation trains (its `world` line)."""
        rank0 = self.run_dir / "logs" / "rank0.log"
        deadline = time.monotonic() + timeout
        while not (rank0.is_file() and " world 2 " in rank0.read_text(errors="replace")):
            assert self.proc.poll() is None, f"ended before training\n{self.console()}"
            assert time.monotonic() < deadline, f"not training after {timeout} s\n{self.console()}"
            time.sleep(0.3)

    def release_once_pending(self) -> bool:
        """A requeued job waits for its BeginTime (~150 s here): start it sooner, once the
        nodes have let go of the old allocation and a few seconds have passed. SLURM's wait
        is its guard against its own race: slurmd revokes the old allocation's job
        credential as it ends it, and a launch whose credential is not newer than that
        revocation fails (the job ends FAILED, exit 1:0, having run nothing: seen on a
        loaded CI machine when released at once)."""
        info = self.scontrol()
        if not (info.get("JobState") == "PENDING" and info.get("Reason") == "BeginTime"):
            self._pending_since = None
            return False
        now = time.monotonic()
        if self._pending_since is None:
            self._pending_since = now
        nodes = self.cluster.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.split()
        if now - self._pending_since < 3 or not nodes or any(s.rstrip("*~#") != "idle" for s in nodes):
            return False
        self.cluster.run("scontrol", "update", f"JobId={self.job_id}", "StartTime=now",
                         check=False)
        self._pending_since = None
        self.released += 1
        return True

    def finish(self, timeout: float = 420) -> int:
        """Follow to the end, releasing every requeue at once; the CLI's exit status."""
        deadline = time.monotonic() + timeout
        try:
            while self.proc.poll() is None:
                assert time.monotonic() < deadline, f"still running after {timeout} s\n{self.console()}"
                self.release_once_pending()
                time.sleep(1)
            return self.proc.returncode
        finally:
            self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        try:
            if (self.run_dir / "job_id").is_file():
                self.cluster.run("scancel", self.job_id, check=False)
        finally:
            self._out.close()


def model(run_dir: Path, epoch: int = EPOCHS) -> dict:
    return torch.load(run_dir / "checkpoints" / f"epoch_{epoch:04d}.pt", map_location="cpu",
                      weights_only=False)["model"]


def check_resumed_run(job: Job, reference: Path | None, allocations: int | None = 2,
                      epochs: int = EPOCHS, steps: int = STEPS) -> list[dict]:
    """The three checks of a run that used several allocations; its segments."""
    run_dir = job.run_dir
    if reference is not None:
        got, want = model(run_dir), model(reference)
        assert got.keys() == want.keys()
        diff = [k for k in want if not torch.equal(got[k], want[k])]
        assert not diff, f"weights differ from the uninterrupted run's: {diff}"
    done = [json.loads(line)["epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert done == list(range(1, epochs + 1)), done
    s = summary(run_dir)
    assert s["status"] == "completed", s
    segs = s["segments"]
    if allocations is not None:
        assert len(segs) == allocations, json.dumps(segs, indent=1)
    job_id = job.job_id
    for i, seg in enumerate(segs):
        assert seg["job_id"] == job_id and seg["restart"] == i, seg
        assert seg["hosts"] and seg["nodes"] == 2 and seg["world_size"] == 2, seg
        assert seg["launcher"] == "slurm", seg
        start, end = (datetime.datetime.fromisoformat(seg[k]) for k in ("start", "end"))
        assert start <= end, seg
        if i:
            prev = segs[i - 1]
            assert prev["status"] == "preempted", prev
            assert datetime.datetime.fromisoformat(prev["end"]) <= start
            assert (seg["start_epoch"], seg["start_step"]) == (prev["end_epoch"], prev["end_step"])
    assert segs[0]["start_epoch"] == 0 and segs[0]["start_step"] == 0
    assert segs[-1]["status"] == "completed" and segs[-1]["end_epoch"] == epochs
    assert sum(seg["steps_done"] for seg in segs) == epochs * steps, segs
    return segs


# the admin's requeue and its reference pin the ranks' threads: by default a rank takes
# cores / local ranks (every core on a node of this cluster, TaskPlugin=task/none: half as
# many for 2 local ranks), and another thread count sums in another order
THREADS = "train.threads=1"


class Reference:
    """The uninterrupted run, local (`launcher=local`: torchrun on this machine, no
    allocation), started in the background: it trains while the SLURM job waits on the
    scheduler (a requeued job's PENDING, the nodes letting go), instead of before it. The
    weights of a run do not depend on where its ranks run (checked side by side at 2 threads
    a rank: bit for bit a SLURM 2 x 1 run's, 18.3 s against 26.6 s on an idle machine; a
    1-rank run bit for bit a `launcher=slurm launcher.nodes=1` run's, 11.2 s against 23.5 s)."""

    def __init__(self, run_dir: Path, data_root: Path, *overrides: str):
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        self.log = run_dir.parent / f"{run_dir.name}.console"
        with open(self.log, "w") as out:  # a file: nobody reads a pipe while it runs
            self.proc = subprocess.Popen(
                [PY, "-m", "ddp_lab", *overrides, "launcher=local", f"run.dir={run_dir}",
                 f"data.root={data_root}"], cwd=run_dir.parent, env=child_env(),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)

    def done(self, timeout: float = 400) -> Path:
        """Its run folder, once it has completed."""
        try:
            rc = self.proc.wait(timeout=timeout)
        finally:
            self.stop()
        assert rc == 0, f"reference run failed\n{self.log.read_text(errors='replace')[-8000:]}"
        return self.run_dir

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


LOCAL = [a for a in TRAIN if not a.startswith("launcher.")]


@pytest.mark.slow
def test_scontrol_requeue_resumes_by_itself(slurm_cluster, shared_data_root, tmp_path):
    # stop checks every 0.2 s and steps a few ms longer (their own generator: the weights
    # are the reference's): on an idle machine an epoch took 1.4 s and the requeue's stop,
    # checked every second, once landed on the epoch's end instead of inside it
    job = Job(slurm_cluster, tmp_path / "run", shared_data_root, THREADS,
              "train.stop_check_s=0.2", "debug.jitter_ms=4")
    ref = None
    try:
        job.wait_training()
        # the same world of 2 gloo CPU ranks, same seed and threads, never stopped
        ref = Reference(tmp_path / "reference", shared_data_root, *LOCAL, THREADS,
                        "launcher.nproc_per_node=2")
        time.sleep(0.5)
        slurm_cluster.run("scontrol", "requeue", job.job_id)  # an admin, or preemption
        rc = job.finish()
        reference = ref.done()
    finally:
        job.stop()
        if ref is not None:
            ref.stop()
    s = summary(reference)
    assert s["status"] == "completed" and s["world_size"] == 2, s
    console, log = job.console(), job.job_log()
    assert rc == 0, console
    err = (job.run_dir / "logs" / f"ddp_lab_{job.job_id}.err").read_text(errors="replace")
    assert "DUE TO JOB REQUEUE" in err, err
    assert "death signal" not in err, err  # torchrun left SLURM's SIGTERM to the ranks
    assert "[sbatch] SIGTERM from SLURM" in log, log
    assert "[sbatch] requeueing job" not in log  # SLURM requeued it: the shell leaves it be
    assert f"[slurm] job {job.job_id} requeued (restart 1)" in console, console
    assert f"[slurm] job {job.job_id} COMPLETED after 1 requeue(s)" in console
    segs = check_resumed_run(job, reference)
    assert segs[0]["end_step"] > 0, segs


@pytest.mark.slow
def test_two_minute_limit_stops_near_its_end_and_the_requeue_completes(
        slurm_cluster, shared_data_root, tmp_path):
    """Seed 002's `--time 00:02:00` as written, `launcher.signal_s` unset: the lead is a
    quarter of the limit (30 s). slurmctld checks its limits every 30 s and sends a
    `--signal` when the lead will have passed by its next check, so USR2 comes 60-90 s into
    each allocation, and the limit itself is only enforced 30 s or more after that. The
    job checkpoints mid-epoch, requeues itself and completes in a later allocation. The
    training is ~100 s of sleep (`debug.slow_ms`: rank 0 a straggler the other waits for),
    so the machine stays idle and one allocation cannot hold it (100 s plus start-up > 90 s);
    after a stop 60 s in, what is left (~50 s plus start-up) fits in the next allocation's
    60 s but for a slow start-up: once, as a rule; at most twice."""
    job = Job(slurm_cluster, tmp_path / "run", shared_data_root, "launcher.time=00:02:00",
              "train.epochs=2", "train.max_steps_per_epoch=250", "debug.slow_rank=0",
              "debug.slow_ms=200", "train.stop_check_s=0.5")
    try:
        rc = job.finish(timeout=480)
    finally:
        job.stop()
    console, log = job.console(), job.job_log()
    assert rc == 0, console
    assert "#SBATCH --signal=B:USR2@30" in (job.run_dir / "job.sbatch").read_text()
    assert "TIMEOUT" not in console and "DUE TO TIME LIMIT" not in log, log
    # a signal can also come as the training ends: only a stopped segment is requeued
    assert log.count("[sbatch] time limit near (SIGUSR2)") >= 1, log
    stops = log.count("run status: preempted")
    assert 1 <= stops <= 2, log
    assert log.count("[sbatch] requeueing job") == stops, log
    assert f"[slurm] job {job.job_id} COMPLETED after {stops} requeue(s), exit code 0:0" in console, console
    segs = check_resumed_run(job, None, allocations=stops + 1, epochs=2, steps=250)
    for seg in segs[:-1]:  # each stopped with a checkpoint, near (and before) its limit
        assert seg["status"] == "preempted" and seg["end_step"] + seg["end_epoch"] > 0, seg
        # a segment starts as the ranks do (10-25 s after the allocation here): SLURM's
        # signal 60-90 s after the allocation's start is 35 s or more into the segment
        start, end = (datetime.datetime.fromisoformat(seg[k]) for k in ("start", "end"))
        assert 30 < (end - start).total_seconds() < 120, seg


@pytest.mark.slow
def test_requeued_onto_one_node_after_two_continues_the_strong_scaling_run(
        slurm_cluster, shared_data_root, tmp_path):
    """A requeue that comes back on a smaller allocation: strong scaling (one global batch
    of 64) stopped mid-epoch on 2 nodes, the requeued job shrunk to 1 node while it waits
    (`scontrol update NumNodes=1`, as a user would to start sooner), the same job continues
    on 1 rank and ends where an uninterrupted 1-rank run does (within 1e-5: the gradient
    sums run in another order). That run is local (torchrun here, no allocation): a 1-rank
    run's weights do not depend on where it runs (checked side by side: bit for bit a
    `launcher=slurm launcher.nodes=1` run's, 11.2 s against 23.5 s on an idle machine)."""
    strong = ("train.epochs=2", "train.global_batch=64")
    # steps a few ms longer (the jitter's own generator: the weights are the reference's): on an
    # idle machine an epoch took 1.75 s, and the USR2 once landed on its end instead of inside it
    job = Job(slurm_cluster, tmp_path / "run", shared_data_root, *strong, "debug.jitter_ms=4")
    ref = None
    try:
        job.wait_training()
        ref = Reference(tmp_path / "reference", shared_data_root, *LOCAL, *strong,
                        "launcher.nproc_per_node=1")
        time.sleep(0.5)
        slurm_cluster.run("scancel", "--signal=USR2", "--batch", job.job_id)
        deadline = time.monotonic() + 120
        while job.scontrol().get("JobState") != "PENDING":
            assert job.proc.poll() is None and time.monotonic() < deadline, job.console()
            time.sleep(0.5)
        slurm_cluster.run("scontrol", "update", f"JobId={job.job_id}", "NumNodes=1", "NumTasks=1")
        rc = job.finish()
        ref.done()
    finally:
        job.stop()
        if ref is not None:
            ref.stop()
    assert summary(tmp_path / "reference")["world_size"] == 1
    console, log = job.console(), job.job_log()
    assert rc == 0, console
    # the time-limit path: USR2 to the batch shell, a mid-epoch checkpoint, a self-requeue
    assert "[sbatch] time limit near (SIGUSR2)" in log and "all ranks stop: preempted" in log, log
    assert f"[sbatch] requeueing job {job.job_id} (restart 1 of at most 3)" in log, log
    assert log.count("[sbatch] job " + job.job_id) == 2  # one log, appended to
    assert f"[slurm] job {job.job_id} requeued (restart 1)" in console, console
    assert f"[slurm] job {job.job_id} COMPLETED after 1 requeue(s), exit code 0:0" in console
    assert "resumed from epoch_" in log and "_step_" in log
    assert f"[sbatch] job {job.job_id} (restart 1)" in log and "1 node(s)" in log, log
    s = summary(job.run_dir)
    segs = s["segments"]
    assert s["status"] == "completed", s
    assert [(g["nodes"], g["world_size"]) for g in segs] == [(2, 2), (1, 1)], segs
    assert segs[0]["status"] == "preempted" and segs[0]["end_step"] > 0, segs  # mid-epoch
    done = [json.loads(line)["epoch"] for line in (job.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert done == [1, 2], done
    got, want = model(job.run_dir, 2), model(tmp_path / "reference", 2)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-5)
