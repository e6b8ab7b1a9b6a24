"""Checkpoints are atomic and damaged ones are named. That a resumed run ends exactly where
an uninterrupted one does is tests/test_rundir_reuse.py (at an epoch boundary) and
tests/test_failures.py (mid-epoch, after a signal)."""

from __future__ import annotations

import pytest
import torch

from ddp_lab.folder import checkpoint_file as checkpoint
from helpers import run_cli


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
    # no temp file left; the checksum is still the old file's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt", "ckpt.pt.sha256"]
    assert checkpoint.damage(path) is None


def test_latest_ignores_temp_files_and_keeps_two(tmp_path):
    for e in range(1, 5):
        checkpoint.save(tmp_path, e, 0, {"x": e})
    (tmp_path / ".epoch_0005.pt.tmp-1").write_bytes(b"partial")
    assert checkpoint.latest(tmp_path).name == "epoch_0004.pt"
    assert sorted(p.name for p in tmp_path.glob("epoch_*.pt")) == ["epoch_0003.pt", "epoch_0004.pt"]


def test_unreadable_checkpoint_is_a_clear_error(tmp_path):
    bad = tmp_path / "epoch_0001.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match="cannot be read.*move it aside"):
        checkpoint.load(bad, torch.device("cpu"))


def test_resume_without_run_dir_is_a_clear_error(tmp_path):
    proc = run_cli("train.resume=true", f"run.root={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2
    assert "train.resume=true needs run.dir=PATH" in proc.stderr
    assert "Traceback" not in proc.stderr
