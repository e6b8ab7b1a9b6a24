"""The run folder is the run's identity: the same command on it continues it, and nothing
ever rewrites a finished run's results (issue 11, item 1)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
import torch
from helpers import child_env, run_cli, run_dir_of, tensorboard


def _tree(run_dir, skip=("logs", "heartbeat")) -> dict[str, str]:
    """Every file of a run folder with its hash; not the logs (they append) nor the ranks'
    live positions (heartbeat/: where a rank is, not a result)."""
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.relative_to(run_dir).parts[0] not in skip}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, shared_data_root):
    """A completed 2-epoch run, shared by the tests below (each checks its hashes)."""
    root = tmp_path_factory.mktemp("reuse")
    proc = run_cli("train.epochs=2", "train.max_steps_per_epoch=30", "train.eval_batch_size=2000",
                   "log.progress=lines", f"data.root={shared_data_root}", f"run.root={root}", cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir_of(proc), shared_data_root


@pytest.mark.dist
@pytest.mark.parametrize("args, says", [
    # the case: a new user reuses a finished run's folder for a quick check
    (["train.epochs=1", "train.max_steps_per_epoch=20"], "holds a"),
    (["train.epochs=2", "train.max_steps_per_epoch=30"], "holds a completed run of 2 epoch(s)"),
    (["train.epochs=3", "train.max_steps_per_epoch=30", "train.resume=false"], "train.resume=auto"),
    (["train.epochs=3", "train.max_steps_per_epoch=30", "model=cnn"], "model=mlp"),
    (["train.epochs=3", "train.max_steps_per_epoch=30", "train.lr=0.01"], "train.lr=0.001"),
])
@pytest.mark.slow
def test_a_finished_run_is_never_rewritten(finished, tmp_path, args, says):
    run_dir, data = finished
    before = _tree(run_dir)
    proc = run_cli(f"run.dir={run_dir}", f"data.root={data}", "train.eval_batch_size=2000",
                   "log.progress=lines", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "run.dir=" in lines[0] and says in lines[0], proc.stderr
    assert _tree(run_dir) == before  # byte-identical, config.yaml included


@pytest.mark.slow
@pytest.mark.dist
def test_launch_script_again_on_a_finished_run_changes_nothing(finished, tmp_path):
    """`bash launch.sh` again (what a requeue or a re-created pod does) on a completed run."""
    run_dir, _ = finished
    before = _tree(run_dir)
    proc = subprocess.run(["bash", str(run_dir / "launch.sh")], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing to do" in proc.stdout
    assert _tree(run_dir) == before


@pytest.mark.dist
@pytest.mark.slow
def test_more_epochs_continue_the_run_and_append(tmp_path, shared_data_root):
    common = ["train.max_steps_per_epoch=25", "train.eval_batch_size=2000", "log.progress=lines",
              f"data.root={shared_data_root}", "timing.tb_every=5",
              "train.threads=1"]  # two runs compared bit for bit: the same threads (cpu.py)
    full = run_cli("train.epochs=2", f"run.root={tmp_path / 'full'}", *common, cwd=tmp_path)
    assert full.returncode == 0, full.stdout + full.stderr
    first = run_cli("train.epochs=1", f"run.root={tmp_path}", *common, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = run_dir_of(first)
    again = run_cli("train.epochs=2", f"run.dir={run_dir}", *common, cwd=tmp_path)  # resume=auto
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resumed from epoch_0001.pt" in again.stdout

    # where an uninterrupted 2-epoch run ends: model and Adam's moments bit-identical
    a = torch.load(run_dir_of(full) / "checkpoints" / "epoch_0002.pt")
    b = torch.load(run_dir / "checkpoints" / "epoch_0002.pt")
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2]
    whole = [json.loads(x) for x in (run_dir_of(full) / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["test_accuracy"] == whole[-1]["test_accuracy"]
    assert records[-1]["train_loss"] == pytest.approx(whole[-1]["train_loss"], rel=1e-12)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs_done"] == 2
    assert [(s["start_epoch"], s["end_epoch"], s["status"]) for s in summary["segments"]] == [
        (0, 1, "completed"), (1, 2, "completed")]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt")) == ["epoch_0001.pt", "epoch_0002.pt"]

    # TensorBoard as it reads the folder: one run, one point per epoch at its last step,
    # per-step points once each, on the same global-step axis
    acc = tensorboard(run_dir)
    assert [e.step for e in acc.Scalars("accuracy/test[fraction]")] == [25, 50]
    steps = [e.step for e in acc.Scalars("step/time[ms]")]  # every few steps (step_stride)
    assert steps == sorted(set(steps)) and steps[0] >= 1 and steps[-1] <= 50, steps
    assert any(s <= 25 for s in steps) and any(s > 25 for s in steps), steps  # both commands'

    # the report shows time per epoch per allocation of the one run
    rep = subprocess.run(
        [sys.executable, "-m", "ddp_lab.report", str(run_dir), "--no-plots"], capture_output=True,
        text=True, timeout=300, cwd=tmp_path, env=child_env())
    assert rep.returncode == 0, rep.stdout + rep.stderr
    md = (run_dir / "report" / "report.md").read_text()
    table = md.split("## Allocations of runs that used several")[1].split("##")[0]
    assert "| epoch 0 | epoch 1 |" in table and "| epoch 1 | epoch 2 |" in table, table


def test_resume_mode_values(tmp_path):
    proc = run_cli("train.resume=maybe", f"run.root={tmp_path}", "launcher.dry_run=true", cwd=tmp_path)
    assert proc.returncode == 2 and "train.resume=maybe: choose auto, true or false" in proc.stderr
