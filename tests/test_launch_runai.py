"""launcher=runai without a RunAI cluster: the rendered pod script run as 2 local "pods"
(the environment RunAI gives each pod), and the whole submit -> follow path through a
stand-in `runai` (tests/fake_runai.py) that accepts only documented flags."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from helpers import PY, QUICK, REPO, child_env, describe, free_port, run_cli, run_dir_of, summary

pytestmark = [pytest.mark.dist, pytest.mark.slow]


def test_pod_script_as_two_local_pods(tmp_path):
    proc = run_cli("launcher=runai", "launcher.dry_run=true", "launcher.nodes=2",
                   "launcher.gpus_per_node=0", "launcher.nproc_per_node=2", "launcher.rdma=true",
                   f"launcher.python={PY}", *QUICK, f"run.root={tmp_path / 'runs'}",
                   f"data.root={tmp_path / 'data'}", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, describe(proc)
    run_dir = run_dir_of(proc)
    port = free_port()
    pods = [subprocess.Popen(["bash", str(run_dir / "pod.sh")], cwd=tmp_path,
                             env=child_env({"WORLD_SIZE": "2", "RANK": str(rank),
                                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for rank in (0, 1)]
    outs = [p.communicate(timeout=300)[0] for p in pods]
    assert [p.returncode for p in pods] == [0, 0], "\n".join(outs)
    s = summary(run_dir)
    assert s["status"] == "completed" and s["world_size"] == 4, s  # 2 pods x 2 processes
    assert s["nodes"] == 2 and s["node_ranks"] == [0, 1] and s["env_source"] == "torchrun"
    for rank in (0, 1):
        assert (run_dir / "logs" / f"pod{rank}.exit").read_text().strip() == "0"
        log = (run_dir / "logs" / f"pod{rank}.log").read_text()
        assert f"[pod {rank}/2]" in log and "NCCL_SOCKET_NTHREADS=4" in log  # nccl_env ran


@pytest.fixture
def fake_runai(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    runai = bin_dir / "runai"
    runai.write_text(f'#!/bin/sh\nexec {PY} {REPO / "tests" / "fake_runai.py"} "$@"\n')
    runai.chmod(0o755)
    record = tmp_path / "runai_call.json"
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_RUNAI_RECORD": str(record)}
    return env, record


def test_submit_and_follow_with_runai_cli(tmp_path, fake_runai):
    env, record = fake_runai
    proc = run_cli("launcher=runai", "launcher.nodes=2", "launcher.gpus_per_node=0",
                   "launcher.nproc_per_node=1", "launcher.image=local/ddp_lab:test",
                   "launcher.rdma=true", f"launcher.python={PY}", "launcher.wait=true",
                   "launcher.wait_timeout_s=300", "launcher.poll_s=1", *QUICK,
                   f"run.root={tmp_path / 'runs'}", f"data.root={tmp_path / 'data'}",
                   cwd=tmp_path, env=env, timeout=400)
    assert proc.returncode == 0, describe(proc)
    run_dir = run_dir_of(proc)
    call = json.loads(record.read_text())
    flags = dict(call["flags"])
    assert flags["--workers"] == "1" and flags["--image"] == "local/ddp_lab:test"
    assert flags["--annotation"] == "k8s.v1.cni.cncf.io/networks=kube-system/roce"
    assert call["command"] == ["bash", str(run_dir / "pod.sh")]
    assert "submitted RunAI job ddplab-" in proc.stdout
    assert "[runai] job ddplab-" in proc.stdout and "pod0 exit 0, pod1 exit 0" in proc.stdout
    s = summary(run_dir)
    assert s["status"] == "completed" and s["world_size"] == 2 and s["node_ranks"] == [0, 1]


def test_failing_pods_return_non_zero_with_the_log_tail(tmp_path, fake_runai):
    env, _ = fake_runai
    proc = run_cli("launcher=runai", "launcher.nodes=2", "launcher.gpus_per_node=0",
                   "launcher.nproc_per_node=1", "launcher.image=local/ddp_lab:test",
                   f"launcher.python={PY}", "launcher.wait=true", "launcher.wait_timeout_s=300",
                   "launcher.poll_s=1", "dist.backend=nccl", *QUICK,
                   f"run.root={tmp_path / 'runs'}", f"data.root={tmp_path / 'data'}",
                   cwd=tmp_path, env=env, timeout=400)
    assert proc.returncode != 0, describe(proc)
    run_dir = run_dir_of(proc)
    assert "failed: the ranks said:" in proc.stderr and "last lines of" in proc.stderr
    assert "nccl needs CUDA" in proc.stderr.split("last lines of")[0]  # the reason comes first
    assert summary(run_dir)["status"].startswith("failed")
