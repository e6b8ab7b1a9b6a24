"""Damaged dataset files (issue 20, item 5): an extracted file of the right size with bytes
flipped in the middle is found by its content's MD5 and extracted again, its archive fetched
again when that is damaged too; a real run repairs it and trains on the intact data."""

from __future__ import annotations

import gzip
import hashlib
import logging
import shutil
from pathlib import Path

import pytest

from ddp_lab.data_fetch import (EMBEDDED, EXTRACTED_MD5, RESOURCES, DataError, fetch_mnist,
                                idx_is_valid, md5sum, raw_folder)
from helpers import run_cli, run_dir_of

IMAGES = "train-images-idx3-ubyte"


def test_extracted_md5s_are_the_official_archives_content():
    for name, _ in RESOURCES:
        content = gzip.decompress((EMBEDDED / name).read_bytes())
        assert hashlib.md5(content).hexdigest() == EXTRACTED_MD5[name.removesuffix(".gz")]


@pytest.fixture
def root(tmp_path, shared_data_root) -> Path:
    """A private copy of the session's MNIST (never damage the shared one)."""
    return Path(shutil.copytree(shared_data_root, tmp_path / "data"))


@pytest.fixture
def logged(caplog, monkeypatch):
    """caplog, with ddp_lab's warnings: a run in this process may have detached its logger
    from the root one (folder/metrics.py)."""
    monkeypatch.setattr(logging.getLogger("ddp_lab"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="ddp_lab")
    return caplog


def damage(path: Path) -> None:
    """Flip 16 bytes in the middle: same size, valid idx header."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 16] = bytes(b ^ 0xFF for b in data[mid:mid + 16])
    path.write_bytes(data)
    assert idx_is_valid(path) and md5sum(path) != EXTRACTED_MD5[path.name]


def test_damaged_extracted_file_is_extracted_again(root, logged):
    f = raw_folder(root) / IMAGES
    damage(f)
    assert fetch_mnist(root, ["embedded"]) == 0  # the archive was intact: nothing fetched
    assert md5sum(f) == EXTRACTED_MD5[IMAGES]
    assert logged.messages == [
        f"{f}: content MD5 mismatch (damaged?): extracted again from {IMAGES}.gz"]
    assert not list(f.parent.glob(".*tmp*"))  # replaced through a temp name


def test_damaged_archive_too_is_fetched_again(root, logged):
    f = raw_folder(root) / IMAGES
    damage(f)
    gz = f.with_name(IMAGES + ".gz")
    gz.write_bytes(gz.read_bytes()[:-100])  # cut short
    assert fetch_mnist(root, ["embedded"]) == 1
    assert md5sum(f) == EXTRACTED_MD5[IMAGES]
    assert logged.messages[-1] == (f"{f}: content MD5 mismatch (damaged?): extracted again from "
                            f"{IMAGES}.gz (fetched from embedded)")
    assert f.with_name(IMAGES + ".gz.corrupt").exists()


def test_damaged_file_that_cannot_be_repaired_fails_the_fetch(root, tmp_path, logged):
    f = raw_folder(root) / IMAGES
    damage(f)
    f.with_name(IMAGES + ".gz").unlink()
    with pytest.raises(DataError, match=rf"{IMAGES}: content MD5 mismatch \(damaged\?\); "
                                        rf"could not fetch {IMAGES}.gz"):
        fetch_mnist(root, [str(tmp_path / "no-mirror")])
    assert not logged.messages  # nothing claims a repair


@pytest.mark.dist
def test_a_run_on_a_damaged_file_repairs_it_then_trains(root, tmp_path):
    f = raw_folder(root) / IMAGES
    damage(f)
    proc = run_cli("launcher.nproc_per_node=1", "dist.device=cpu", "train.epochs=1",
                   "train.max_steps_per_epoch=5", "train.eval_batch_size=2000",
                   f"data.root={root}", f"run.root={tmp_path / 'out'}", "log.progress=lines",
                   cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (run_dir_of(proc) / "logs" / "rank0.log").read_text()
    assert f"{f}: content MD5 mismatch (damaged?): extracted again from {IMAGES}.gz" in log
    assert md5sum(f) == EXTRACTED_MD5[IMAGES]
