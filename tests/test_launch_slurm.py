"""launcher=slurm against the real loopback cluster (scripts/slurm_cluster.sh, 2 nodes):
`python -m ddp_lab launcher=slurm ...` submits, follows and returns the job's exit status."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import QUICK, describe, run_cli, run_dir_of, summary

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.dist]

FOLLOW = ["launcher.wait=true", "launcher.wait_timeout_s=300", "launcher.poll_s=1"]


def submit(cluster, tmp_path, *overrides, timeout=400):
    return run_cli("launcher=slurm", *overrides, *QUICK, f"run.root={tmp_path / 'runs'}",
                   f"data.root={tmp_path / 'data'}", cwd=tmp_path,
                   env=cluster.env, timeout=timeout)


_BLOCK = """import sys
class Without:  # a python with torch and torchvision only: the others are not there
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("hydra", "omegaconf"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Without())
"""


def container_python(tmp_path) -> Path:
    """A stand-in for a container image's python that has torch and torchvision but not
    hydra-core/omegaconf (the NGC image of the assignment): this interpreter with those
    two hidden."""
    (tmp_path / "image").mkdir()
    (tmp_path / "image" / "sitecustomize.py").write_text(_BLOCK)
    py = tmp_path / "image" / "python"
    py.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "image"}${{PYTHONPATH:+:$PYTHONPATH}} '
                  f'exec {sys.executable} "$@"\n')
    py.chmod(0o755)
    return py


def venv_over(tmp_path) -> Path:
    """What `python -m venv --system-site-packages` over that image's python, with ddp_lab
    installed in it, gives the ranks: a bin/python that imports everything."""
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    py = tmp_path / "venv" / "bin" / "python"
    py.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    py.chmod(0o755)
    return tmp_path / "venv"


def test_a_python_without_hydra_ends_the_job_in_one_line(slurm_cluster, tmp_path):
    py = container_python(tmp_path)
    proc = submit(slurm_cluster, tmp_path, "launcher.nodes=2", "launcher.nproc_per_node=1",
                  f"launcher.python={py}", *FOLLOW)
    assert proc.returncode != 0, describe(proc)
    line = f"[ddp_lab] {sys.executable} cannot import hydra, omegaconf: install them"
    assert line in proc.stdout + proc.stderr, describe(proc)
    assert not (run_dir_of(proc) / "logs" / "rank0.log").exists()  # no rank started


def test_two_nodes_one_torchrun_each(slurm_cluster, tmp_path):
    # the ranks' python from launcher.venv (the container recipe, docs/launchers.md)
    venv = venv_over(tmp_path)
    proc = submit(slurm_cluster, tmp_path, "sync=ddp", "launcher.nodes=2",
                  "launcher.nproc_per_node=2", f"launcher.venv={venv}", *FOLLOW)
    assert proc.returncode == 0, describe(proc)
    run_dir = run_dir_of(proc)
    assert f"exec {venv}/bin/python -m torch.distributed.run" in (run_dir / "job.sbatch").read_text()
    s = summary(run_dir)
    assert s["status"] == "completed" and s["launcher"] == "slurm", s
    assert s["world_size"] == 4 and s["nodes"] == 2 and s["nproc_per_node"] == 2
    assert s["node_ranks"] == [0, 1] and s["env_source"] == "torchrun"
    job_id = (run_dir / "job_id").read_text().strip()
    assert f"submitted SLURM job {job_id}" in proc.stdout
    assert f"[slurm] job {job_id} COMPLETED, exit code 0:0" in proc.stdout
    out = run_dir / "logs" / f"ddp_lab_{job_id}.out"
    assert str(out) in proc.stdout and "[rank 0] epoch 1/1" in out.read_text()
    assert "[rank 0] epoch 1/1" in proc.stdout  # the log was streamed while following
    assert "[srun] node 0 of 2" in out.read_text() and "[srun] node 1 of 2" in out.read_text()


def test_two_nodes_one_task_per_process(slurm_cluster, tmp_path):
    proc = submit(slurm_cluster, tmp_path, "launcher.nodes=2", "launcher.nproc_per_node=2",
                  "launcher.per_task=true", *FOLLOW)
    assert proc.returncode == 0, describe(proc)
    s = summary(run_dir_of(proc))
    assert s["status"] == "completed" and s["world_size"] == 4, s
    assert s["node_ranks"] == [0, 1] and s["env_source"] == "slurm"


def test_failed_job_returns_its_exit_status_and_error_tail(slurm_cluster, tmp_path):
    # valid at submission, fatal inside the job: nccl needs GPUs the nodes do not have
    proc = submit(slurm_cluster, tmp_path, "launcher.nodes=2", "launcher.nproc_per_node=1",
                  "dist.backend=nccl", *FOLLOW)
    assert proc.returncode != 0, describe(proc)
    run_dir = run_dir_of(proc)
    job_id = (run_dir / "job_id").read_text().strip()
    assert f"[slurm] job {job_id} FAILED" in proc.stdout, describe(proc)
    assert f"last lines of {run_dir}/logs/ddp_lab_{job_id}.err" in proc.stderr
    assert "nccl needs CUDA" in proc.stderr.split("last lines of")[0]  # the reason comes first
    assert "dist.backend=nccl needs CUDA tensors" in proc.stdout  # the reason, on the console
    assert "job failed with exit status" in proc.stdout
    s = summary(run_dir)
    assert s["status"].startswith("failed") and "nccl needs CUDA" in s["status"], s
    logs = {p.name for p in (run_dir / "logs").iterdir()}
    assert {f"ddp_lab_{job_id}.out", f"ddp_lab_{job_id}.err", "rank0.log"} <= logs
    assert "Traceback" in (run_dir / "logs" / "rank0.log").read_text()  # the details stay there


def test_without_wait_prints_job_and_returns(slurm_cluster, tmp_path):
    # launcher.wait=null and stdin is not a terminal: submit, print, return at once
    t0 = time.monotonic()
    proc = submit(slurm_cluster, tmp_path, "launcher.nodes=2", "launcher.nproc_per_node=1",
                  timeout=120)
    assert proc.returncode == 0, describe(proc)
    run_dir = run_dir_of(proc)
    job_id = (run_dir / "job_id").read_text().strip()
    subprocess.run(["scancel", job_id], env=slurm_cluster.env, timeout=30)
    assert time.monotonic() - t0 < 60
    assert f"submitted SLURM job {job_id}" in proc.stdout
    assert f"not following it (launcher.wait=false): squeue -j {job_id}" in proc.stdout
