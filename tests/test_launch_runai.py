"""launcher=runai without a RunAI cluster: the rendered pod script run as 2 local "pods"
(the environment RunAI gives each pod), and the whole submit -> follow path through a
stand-in `runai` (tests/fake_runai.py) that accepts only documented flags. Preemption is
played as Kubernetes plays it: SIGTERM to one pod's script (its PID 1), then the pods are
started again on the same run folder."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from fake_runai import quiet_port
from helpers import PY, QUICK, REPO, child_env, describe, run_cli, run_dir_of, summary

from ddp_lab.launch import job_processes
from ddp_lab.launch.runai import PREEMPTED_EXIT
from ddp_lab.folder.rundir import EXIT_STOPPED

pytestmark = [pytest.mark.dist, pytest.mark.slow]


def test_pod_script_as_two_local_pods(tmp_path):
    proc = run_cli("launcher=runai", "launcher.dry_run=true", "launcher.nodes=2",
                   "launcher.gpus_per_node=0", "launcher.nproc_per_node=2", "launcher.rdma=true",
                   f"launcher.python={PY}", *QUICK, f"run.root={tmp_path / 'runs'}",
                   f"data.root={tmp_path / 'data'}", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, describe(proc)
    run_dir = run_dir_of(proc)
    port = quiet_port()
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
                   f"launcher.pvc=[scratch:{tmp_path}]",
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
                   f"launcher.pvc=[scratch:{tmp_path}]",
                   f"launcher.python={PY}", "launcher.wait=true", "launcher.wait_timeout_s=300",
                   "launcher.poll_s=1", "dist.backend=nccl", *QUICK,
                   f"run.root={tmp_path / 'runs'}", f"data.root={tmp_path / 'data'}",
                   cwd=tmp_path, env=env, timeout=400)
    assert proc.returncode != 0, describe(proc)
    run_dir = run_dir_of(proc)
    assert "failed: the ranks said:" in proc.stderr and "last lines of" in proc.stderr
    assert "nccl needs CUDA" in proc.stderr.split("last lines of")[0]  # the reason comes first
    assert summary(run_dir)["status"].startswith("failed")


# long enough to be caught mid-run, short enough for CI; stop checks 0.2 s apart
PREEMPTIBLE = ["launcher=runai", "launcher.nodes=2", "launcher.gpus_per_node=0",
               "launcher.nproc_per_node=1", f"launcher.python={PY}", "train.epochs=2",
               "train.max_steps_per_epoch=120", "train.eval_batch_size=2000",
               "train.stop_check_s=0.2", "log.progress=lines"]


def start_pods(run_dir: Path, cwd: Path) -> list[subprocess.Popen]:
    """The pods RunAI (re-)creates: `bash pod.sh`, each in its own session."""
    port = quiet_port()
    return [subprocess.Popen(["bash", str(run_dir / "pod.sh")], cwd=cwd,
                             env=child_env({"WORLD_SIZE": "2", "RANK": str(rank),
                                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}),
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
            for rank in (0, 1)]


def wait_for(what: str, check, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s"
        time.sleep(0.2)


def text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def exit_files(run_dir: Path) -> list[str]:
    return [text(run_dir / "logs" / f"pod{rank}.exit").strip() for rank in (0, 1)]


def final_model(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "epoch_0002.pt", weights_only=False)["model"]


def test_sigterm_to_one_pod_stops_both_and_the_restarted_pods_resume(tmp_path, fake_runai,
                                                                      shared_data_root):
    env, record = fake_runai
    data = f"data.root={shared_data_root}"
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "run"
    proc = run_cli(*PREEMPTIBLE, "launcher.dry_run=true", f"run.dir={ref_dir}", data,
                   cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, describe(proc)
    groups: list[int] = []  # every process group this test starts, ended in `finally`
    try:
        reference = start_pods(ref_dir, tmp_path)  # uninterrupted, meanwhile
        groups += [p.pid for p in reference]
        cli = subprocess.Popen(
            [PY, "-m", "ddp_lab", *PREEMPTIBLE, "launcher.image=local/ddp_lab:test",
             f"launcher.pvc=[scratch:{tmp_path.parent}]", "launcher.wait=true", "launcher.poll_s=0.5",
             f"run.dir={run_dir}", data],
            cwd=tmp_path, env=child_env(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True)
        groups.append(cli.pid)
        wait_for("runai submit", lambda: record.exists())
        pods = json.loads(record.read_text())["pods"]
        groups += pods
        wait_for("training", lambda: "[rank 0] world 2" in text(run_dir / "logs" / "pod0.log"))
        os.kill(pods[1], signal.SIGTERM)  # Kubernetes stops a pod: SIGTERM to its PID 1

        out, err = cli.communicate(timeout=180)
        # both pods stopped gracefully; the follower reports a preemption, not a failure
        assert cli.returncode == EXIT_STOPPED, f"rc={cli.returncode}\n{out}\n{err}"
        code = str(PREEMPTED_EXIT)
        assert exit_files(run_dir) == [code, code], f"{out}\n{err}"
        assert f"pod0 exit {code}, pod1 exit {code}" in out and "failed" not in err
        assert "[runai] job ddplab-run: preempted after" in out and "by itself" in out
        s = summary(run_dir)
        assert s["status"] == "preempted" and "SIGTERM to pod 1" in s["stop_reason"], s
        assert (s["epochs_done"], s["step_in_epoch"]) < (2, 0), s  # caught mid-run
        assert list((run_dir / "checkpoints").glob("epoch_*.pt")), "no checkpoint"
        assert "SIGTERM: every rank stops" in text(run_dir / "logs" / "pod1.log")
        wait_for("the job's processes to end", lambda: not job_processes(run_dir), 10)

        # RunAI creates the pods again: they resume from the checkpoint by themselves
        again = start_pods(run_dir, tmp_path)
        groups += [p.pid for p in again]
        assert [p.wait(timeout=240) for p in again] == [0, 0], text(run_dir / "logs" / "pod0.log")
        assert exit_files(run_dir) == ["0", "0"]
        s = summary(run_dir)
        assert s["status"] == "completed" and s["epochs_done"] == 2, s
        segments = s["segments"]
        assert [g["status"] for g in segments] == ["preempted", "completed"], segments
        assert {g["job_id"] for g in segments} == {"ddplab-run"}  # pod.sh names the RunAI job
        assert (segments[1]["start_epoch"], segments[1]["start_step"]) == \
            (segments[0]["end_epoch"], segments[0]["end_step"])
        epochs = [json.loads(line)["epoch"] for line in text(run_dir / "metrics.jsonl").splitlines()]
        assert epochs == [1, 2]
        log0 = text(run_dir / "logs" / "pod0.log")  # appended: both starts of the pod
        assert log0.count("[pod 0/2]") > 2 and "resumed from" in text(run_dir / "logs" / "rank0.log")

        assert [p.wait(timeout=240) for p in reference] == [0, 0]
        ref, got = final_model(ref_dir), final_model(run_dir)
        assert ref.keys() == got.keys()
        assert all(torch.equal(ref[k], got[k]) for k in ref), "resumed weights differ"
    finally:
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        for folder in (ref_dir, run_dir):
            for pid in job_processes(folder):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
