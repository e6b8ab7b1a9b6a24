"""The whole path of a run, as a user types it: `python -m ddp_lab`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from helpers import free_port, run_cli, run_dir_of, tensorboard

SCALARS = {"loss/train", "loss/test", "accuracy/test[fraction]", "time/epoch[s]",
           "throughput/train[samples/s]", "comm/busbw[GB/s]"}


def test_torch_and_torchvision_import_together():
    # a torchvision built for another torch fails here ("torchvision::nms does not exist")
    proc = subprocess.run([sys.executable, "-c", "import torch, torchvision; "
                           "from torchvision.ops import nms; print(torch.__version__)"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_help_lists_the_groups_and_a_meaning_beside_every_key(tmp_path):
    proc = run_cli("--help", cwd=tmp_path)
    assert proc.returncode == 0
    for group in ("launcher", "sync", "model", "data", "optim"):
        assert f"{group}:" in proc.stdout
    keys = proc.stdout.split("== Config ==", 1)[1].split("Powered by Hydra")[0].splitlines()[2:]
    leaves = [ln for ln in keys if ln.strip() and not ln.rstrip().endswith(":")]
    assert len(leaves) > 60, leaves
    bare = [ln for ln in leaves if " # " not in ln]
    assert not bare, bare  # every key has its meaning (the schema's field docstrings)
    assert all(len(ln) <= 100 for ln in keys), [ln for ln in keys if len(ln) > 100]
    assert "  nodes: 1" in proc.stdout and "# number of machines" in proc.stdout
    slurm = run_cli("--help", "launcher=slurm", cwd=tmp_path)  # the composed config's keys
    assert "  signal_s: null" in slurm.stdout and "#SBATCH --signal" in slurm.stdout


def test_dry_run_renders_and_starts_nothing(tmp_path):
    proc = run_cli("launcher.dry_run=true", "launcher.nproc_per_node=3", f"run.root={tmp_path}",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = run_dir_of(proc)
    script = (run_dir / "launch.sh").read_text()
    assert "--nproc_per_node=\"$NPROC_PER_NODE\"" in script and "NPROC_PER_NODE:-3" in script
    assert f"-m ddp_lab.worker {run_dir}" in script
    assert subprocess.run(["bash", "-n", str(run_dir / "launch.sh")]).returncode == 0
    assert (run_dir / "config.yaml").exists() and not (run_dir / "summary.json").exists()


def test_bad_value_is_one_line_no_traceback(tmp_path):
    proc = run_cli("train.epochs=0", f"run.root={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: train.epochs=0: must be >= 1"


def test_port_in_use_is_a_clear_error(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = run_cli(f"launcher.master_port={port}", f"run.root={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2 and f"port {port} is in use" in proc.stderr


@pytest.mark.slow
@pytest.mark.dist
def test_failing_job_exits_non_zero_and_keeps_its_logs(tmp_path):
    # an unreachable mirror and an empty root: rank 0 fails, rank 1 learns it and stops
    proc = run_cli("train.epochs=1", f"data.root={tmp_path / 'empty'}",
                   "data.mirrors=[http://127.0.0.1:9/]", f"run.root={tmp_path}", cwd=tmp_path,
                   timeout=300)
    assert proc.returncode != 0
    run_dir = run_dir_of(proc)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"].startswith("failed")
    assert "could not fetch" in (run_dir / "logs" / "rank0.log").read_text()
    assert "rank 0 failed to prepare MNIST" in (run_dir / "logs" / "rank1.log").read_text()


@pytest.mark.dist
@pytest.mark.slow
def test_default_run_reaches_the_notebook_accuracy(tmp_path, shared_data_root):
    """`python -m ddp_lab` with no arguments (but where to write): 2 ranks, 5 epochs."""
    proc = run_cli(f"run.root={tmp_path / 'outputs'}", f"data.root={shared_data_root}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = run_dir_of(proc)
    assert {p.name for p in run_dir.iterdir()} >= {
        "config.yaml", "launch.sh", "metrics.jsonl", "summary.json", "tb", "checkpoints", "logs"}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["world_size"] == 2 and summary["epochs"] == 5 and summary["sync"] == "ddp"
    assert summary["test_accuracy"] >= 0.96, summary
    for key in ("launcher", "backend", "device", "nodes", "nproc_per_node", "epoch_time_s_median",
                "epoch_time_s_mean", "comm_fraction", "hosts"):
        assert summary[key] is not None, key
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3, 4, 5]
    assert all(0 <= r["test_accuracy"] <= 1 and r["epoch_time_s"] > 0 for r in records)
    assert records[-1]["comm"]["bytes_sent"] > 0
    assert sorted(p.name for p in (run_dir / "logs").glob("rank*.log")) == ["rank0.log", "rank1.log"]
    assert "[rank 0] epoch 5/5" in proc.stdout

    # TensorBoard: read the event files back (x: global step, an epoch's points at its end) ...
    acc = tensorboard(run_dir)
    tags = set(acc.Tags()["scalars"])
    assert SCALARS <= tags
    n = summary["steps_run"] // 5  # steps per epoch
    assert [e.step for e in acc.Scalars("accuracy/test[fraction]")] == [n, 2 * n, 3 * n, 4 * n, 5 * n]
    assert acc.Scalars("accuracy/test[fraction]")[-1].value == pytest.approx(summary["test_accuracy"])

    # ... and ask a real TensorBoard server on loopback, as `tensorboard --logdir` would
    port = free_port()
    tb = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(tmp_path / "outputs"),
                           "--host", "127.0.0.1", "--port", str(port), "--reload_interval", "1"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        served: dict = {}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5) as r:
                    served = json.load(r)
                if any(SCALARS <= set(t) for t in served.values()):
                    break
            except OSError:
                pass
            time.sleep(1)
        assert any(SCALARS <= set(t) for t in served.values()), served
        runs = list(served)  # one TensorBoard run per training, named for the sidebar
        # `<run folder, named by the label>/tb/full`: the label once, then what it does not say
        assert len(runs) == 1 and runs[0] == f"{run_dir.name}/tb/full", runs
        assert run_dir.name.startswith("ddp_w2_mlp_"), run_dir
    finally:
        tb.terminate()
        tb.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_missing_peer_or_master_fails_within_the_timeout(tmp_path, rank):
    """Rank 0 alone (a peer never comes) or rank 1 alone (no master): an error, not a hang."""
    proc = run_cli("launcher.dry_run=true", "dist.init_timeout_s=5", f"run.root={tmp_path}", cwd=tmp_path)
    run_dir = run_dir_of(proc)
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    t0 = time.monotonic()
    worker = run_cli(str(run_dir), module="ddp_lab.worker", cwd=tmp_path, env=env, timeout=120)
    assert worker.returncode == 1
    assert time.monotonic() - t0 < 60
    assert "failed:" in worker.stdout + worker.stderr
    assert "Traceback" not in worker.stdout + worker.stderr  # the trace is in the rank's log
