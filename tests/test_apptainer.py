"""launcher.image: the ranks' python in an Apptainer/Singularity image, for launcher=slurm
and launcher=mpirun. No real Apptainer runs here (it is not in this machine's package
archive): a stand-in on PATH (tests/fake_apptainer.py) checks every command line against
Apptainer's documented `exec` CLI and then runs the command on the host. What is real:
the rendered scripts, the loopback SLURM cluster and Open MPI's mpirun that run them, the
pre-flight import check under the runtime, the training.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from helpers import QUICK, REPO, describe, run_cli, run_dir_of, summary

STAND_IN = Path(__file__).with_name("fake_apptainer.py")


def sif(tmp_path) -> Path:
    """An image file with a SIF file's launch line and magic (the stand-in reads that)."""
    image = tmp_path / "pytorch_24.01.sif"
    image.write_bytes(b"#!/usr/bin/env run-singularity\n".ljust(32) + b"SIF_MAGIC" + bytes(64))
    return image


def runtime_on_path(tmp_path, env: dict) -> tuple[dict, Path]:
    """`apptainer` and `singularity` on PATH as the stand-in, its log of calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("apptainer", "singularity"):
        (bin_dir / name).write_text(f"#!/bin/sh\nFAKE_APPTAINER_NAME={name} "
                                    f"exec {sys.executable} {STAND_IN} \"$@\"\n")
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.jsonl"
    return {**env, "PATH": f"{bin_dir}:{env.get('PATH', '')}", "FAKE_APPTAINER_LOG": str(log)}, log


def venv_over_image(tmp_path) -> Path:
    """launcher.venv: what `python -m venv --system-site-packages` inside the image gives,
    with ddp_lab in it; here a bin/python that runs this interpreter."""
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    py = tmp_path / "venv" / "bin" / "python"
    py.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    py.chmod(0o755)
    return tmp_path / "venv"


def calls(log: Path) -> list[dict]:
    return [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []


def test_dry_runs_show_the_ranks_under_the_image(tmp_path):
    image, venv = sif(tmp_path), venv_over_image(tmp_path)
    common = [f"launcher.image={image}", f"launcher.venv={venv}", "launcher.dry_run=true",
              f"run.root={tmp_path / 'runs'}", f"data.root={tmp_path / 'data'}"]
    binds = f"{tmp_path / 'data'},{REPO},{venv}"
    proc = run_cli("launcher=slurm", "launcher.nodes=2", *common, cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert (f"exec apptainer exec --nv --bind $RUN_DIR,{binds} {image} {venv}/bin/python "
            "-m torch.distributed.run") in proc.stdout, describe(proc)
    proc = run_cli("launcher=mpirun", "launcher.hosts=[localhost:2]", "dist.device=cpu",
                   "launcher.runtime=singularity", *common, cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    run_dir = run_dir_of(proc)
    assert (f"exec singularity exec --bind {run_dir},{binds} {image} {venv}/bin/python "
            "-m ddp_lab.worker") in proc.stdout, describe(proc)  # dist.device=cpu: no --nv


@pytest.mark.parametrize("launcher", ["launcher=slurm", "launcher=mpirun"])
def test_a_missing_image_or_runtime_is_one_line_before_anything_starts(tmp_path, launcher):
    common = [launcher, f"run.root={tmp_path / 'runs'}", f"data.root={tmp_path / 'data'}"]
    proc = run_cli(*common, f"launcher.image={tmp_path / 'nope.sif'}", cwd=tmp_path)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip() == (f"error: launcher.image={tmp_path / 'nope.sif'}: no such image "
                                   "(a .sif file every node sees, or a docker:// reference)")
    env = {"PATH": os.path.dirname(shutil.which("bash"))}  # no apptainer there
    proc = run_cli(*common, f"launcher.image={sif(tmp_path)}", cwd=tmp_path, env=env)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip().startswith("error: apptainer not found on PATH: "), describe(proc)
    proc = run_cli(*common, f"launcher.image={sif(tmp_path)}", "launcher.runtime=docker",
                   cwd=tmp_path)
    assert proc.returncode == 2, describe(proc)
    assert "launcher.runtime=docker: choose apptainer or singularity" in proc.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.dist
def test_slurm_ranks_run_under_the_runtime_on_every_node(slurm_cluster, tmp_path):
    env, log = runtime_on_path(tmp_path, slurm_cluster.env)
    image, venv = sif(tmp_path), venv_over_image(tmp_path)
    proc = run_cli("launcher=slurm", "launcher.nodes=2", "launcher.nproc_per_node=1",
                   f"launcher.image={image}", f"launcher.venv={venv}", *QUICK,
                   "launcher.wait=true", "launcher.wait_timeout_s=300", "launcher.poll_s=1",
                   f"run.root={tmp_path / 'runs'}", f"data.root={tmp_path / 'data'}",
                   cwd=tmp_path, env=env, timeout=400)
    assert proc.returncode == 0, describe(proc)
    s = summary(run_dir_of(proc))
    assert s["status"] == "completed" and s["world_size"] == 2 and s["nodes"] == 2, s
    seen = calls(log)
    assert all(c["image"] == str(image) and "--nv" in c["options"] for c in seen), seen
    # the batch shell's import check, then one torchrun per node
    assert seen[0]["command"][:2] == [f"{venv}/bin/python", "-c"], seen
    torchruns = [c for c in seen if c["command"][1:3] == ["-m", "torch.distributed.run"]]
    assert len(torchruns) == 2, seen


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.dist
def test_mpirun_ranks_run_under_the_runtime(tmp_path, shared_data_root):
    env, log = runtime_on_path(tmp_path, dict(os.environ))
    image, venv = sif(tmp_path), venv_over_image(tmp_path)
    proc = run_cli("launcher=mpirun", "launcher.hosts=[localhost:2]", f"launcher.image={image}",
                   "launcher.runtime=singularity", f"launcher.venv={venv}", *QUICK,
                   f"run.root={tmp_path / 'runs'}", f"data.root={shared_data_root}",
                   cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, describe(proc)
    s = summary(run_dir_of(proc))
    assert s["status"] == "completed" and s["world_size"] == 2, s
    seen = calls(log)
    assert {c["runtime"] for c in seen} == {"singularity"}, seen
    workers = [c for c in seen if c["command"][1:3] == ["-m", "ddp_lab.worker"]]
    checks = [c for c in seen if c["command"][1] == "-c"]
    assert len(workers) == 2 and len(checks) == 2, seen  # each rank: its check, then itself
