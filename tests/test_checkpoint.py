"""Checkpoints are atomic, and a resumed run ends exactly where an uninterrupted one does."""

from __future__ import annotations

import json

import pytest
import torch

from ddp_lab.run import checkpoint
from helpers import run_cli, run_dir_of


def test_atomic_save_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    checkpoint.atomic_save({"v": 1}, path)

    def boom(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.atomic_save({"v": 2}, path)
    monkeypatch.undo()
    assert torch.load(path)["v"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temp file left


def test_latest_ignores_temp_files_and_keeps_two(tmp_path):
    for e in range(1, 5):
        checkpoint.save_epoch(tmp_path, e, {"x": e})
    (tmp_path / ".epoch_0005.pt.tmp-1").write_bytes(b"partial")
    assert checkpoint.latest(tmp_path).name == "epoch_0004.pt"
    assert sorted(p.name for p in tmp_path.glob("epoch_*")) == ["epoch_0003.pt", "epoch_0004.pt"]


def test_unreadable_checkpoint_is_a_clear_error(tmp_path):
    bad = tmp_path / "epoch_0001.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match="cannot be read.*delete it"):
        checkpoint.load(bad, torch.device("cpu"))


@pytest.mark.dist
@pytest.mark.slow
def test_resume_equals_uninterrupted_run(tmp_path, shared_data_root):
    common = ["train.max_steps_per_epoch=40", f"data.root={shared_data_root}",
              f"run.root={tmp_path}", "log.progress=lines"]
    full = run_cli("train.epochs=2", *common, cwd=tmp_path)
    assert full.returncode == 0, full.stdout + full.stderr
    full_dir = run_dir_of(full)

    first = run_cli("train.epochs=1", *common, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    part_dir = run_dir_of(first)
    again = run_cli("train.epochs=2", "train.resume=true", f"run.dir={part_dir}", *common, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resumed from epoch_0001.pt" in again.stdout

    a = torch.load(full_dir / "checkpoints" / "epoch_0002.pt")
    b = torch.load(part_dir / "checkpoints" / "epoch_0002.pt")
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k  # bit-identical
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"])
    ra = [json.loads(x) for x in (full_dir / "metrics.jsonl").read_text().splitlines()]
    rb = [json.loads(x) for x in (part_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rb] == [1, 2]
    assert ra[-1]["test_accuracy"] == rb[-1]["test_accuracy"]
    assert ra[-1]["train_loss"] == pytest.approx(rb[-1]["train_loss"], rel=1e-12)


def test_resume_without_run_dir_is_a_clear_error(tmp_path):
    proc = run_cli("train.resume=true", f"run.root={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2
    assert "train.resume=true needs run.dir=PATH" in proc.stderr
    assert "Traceback" not in proc.stderr
