"""A study on the loopback SLURM cluster (2 nodes x 2 CPUs): ONE sbatch allocation runs
worlds [1,2,4] as srun job steps of their own size (world 4 = 2 nodes x 2)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import describe, run_cli, summary

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.dist]


def test_one_allocation_runs_every_world_as_a_job_step(slurm_cluster, tmp_path):
    proc = run_cli("study=scaling", "study.worlds=[1,2,4]", "study.repeats=1", "launcher=slurm",
                   "launcher.nodes=2", "launcher.nproc_per_node=2", "launcher.wait=true",
                   "launcher.wait_timeout_s=300", "launcher.poll_s=1",
                   "train.epochs=1", "train.max_steps_per_epoch=10", "log.progress=lines",
                   f"run.root={tmp_path / 'runs'}", f"data.root={tmp_path / 'data'}",
                   cwd=tmp_path, env=slurm_cluster.env, timeout=400)
    assert proc.returncode == 0, describe(proc)
    folder = Path(proc.stdout.rstrip().splitlines()[-1].removeprefix("run dir: "))
    plan = json.loads((folder / "study.json").read_text())
    assert plan["status"] == "completed", plan
    job_id = (folder / "job_id").read_text().strip()
    assert proc.stdout.count("submitted SLURM job") == 1, describe(proc)
    shapes = {1: (1, 1), 2: (1, 2), 4: (2, 2)}  # nodes x processes per node
    for p in plan["points"]:
        s = summary(folder / p["folder"])
        assert s["status"] == "completed" and s["world_size"] == p["world"], s
        assert (s["nodes"], s["nproc_per_node"]) == shapes[p["world"]], s
        assert {seg["job_id"] for seg in s["segments"]} == {job_id}, s["segments"]
        assert s["study"]["world"] == p["world"] and s["study"]["id"] == folder.name
        assert (f"[study] point {p['index']}/3: world {p['world']}, repeat 1: completed"
                in proc.stdout), describe(proc)
    # one allocation, one fingerprint: the report compares world 4 on two nodes with world 1
    # on one without a flag
    ids = {summary(folder / p["folder"])["fingerprint_id"] for p in plan["points"]}
    assert len(ids) == 1 and None not in ids, ids
    (group,) = json.loads((folder / "report" / "report.json").read_text())["scaling"]
    assert list(group["fingerprints"]) == list(ids), group["fingerprints"]
    assert [r["world_size"] for r in group["rows"]] == [1, 2, 4], group["rows"]
    assert not any(r["cross_fingerprint"] for r in group["rows"]), group["rows"]


def test_time_limit_signal_stops_the_point_and_the_requeued_job_continues_the_study(
        slurm_cluster, shared_data_root, tmp_path):
    """USR2 to the batch shell (as --signal=B:USR2@N) while point 2 trains: it checkpoints,
    the job requeues itself; the requeued allocation keeps point 1 and resumes point 2."""
    from test_slurm_requeue import Job  # the CLI followed in the background, requeues released

    folder = tmp_path / "study"
    job = Job(slurm_cluster, folder, shared_data_root, "study=scaling", "study.worlds=[1,2]",
              "study.repeats=1", "study.report=false")
    try:
        rank0 = folder / "points/w2_r1/logs/rank0.log"
        deadline = time.monotonic() + 200
        while not (rank0.is_file() and " world 2 " in rank0.read_text(errors="replace")):
            assert job.proc.poll() is None, job.console()
            assert time.monotonic() < deadline, job.console()
            time.sleep(0.3)
        first = (folder / "points/w1_r1/summary.json").read_bytes()
        slurm_cluster.run("scancel", "--signal=USR2", "--batch", job.job_id)
        rc = job.finish()
    finally:
        job.stop()
    assert rc == 0, job.console()
    assert job.released >= 1, job.console()  # it was requeued
    plan = json.loads((folder / "study.json").read_text())
    assert plan["status"] == "completed", plan
    assert (folder / "points/w1_r1/summary.json").read_bytes() == first  # kept
    s = summary(folder / "points/w2_r1")
    assert s["status"] == "completed" and len(s["segments"]) == 2, s["segments"]
    assert s["segments"][0]["status"] == "preempted"
    assert {seg["job_id"] for seg in s["segments"]} == {job.job_id}
