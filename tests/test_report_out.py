"""The report writes beside the runs it reads, never into the current folder unasked."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ddp_lab.report.__main__ import main


def _run(root: Path, name: str, world: int) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(f"launcher:\n  name: local\n  nproc_per_node: {world}\n"
                                   "sync:\n  name: ddp\nmodel:\n  name: mlp\n")
    (d / "summary.json").write_text(json.dumps({
        "status": "completed", "launcher": "local", "sync": "ddp", "backend": "gloo",
        "device": "cpu", "nodes": 1, "nproc_per_node": world, "world_size": world, "epochs": 1,
        "test_accuracy": 0.9, "epoch_time_s_median": 2.0 / world,
        "epoch_time_s_mean": 2.0 / world, "comm_fraction": 0.2, "hosts": ["h"]}))
    return d


def test_default_out_is_inside_the_folder_read(tmp_path, monkeypatch, capsys):
    outputs, cwd = tmp_path / "outputs", tmp_path / "elsewhere"
    _run(outputs, "a", 1), _run(outputs, "b", 2)
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert main([str(outputs), "--no-plots"]) == 0
    assert (outputs / "report" / "report.json").is_file()
    assert os.listdir(cwd) == []
    # a second report over the same folder skips the first one's output and finds the same runs
    assert main([str(outputs), "--no-plots"]) == 0
    assert "2 training run(s)" in capsys.readouterr().out


def test_default_out_for_several_folders_is_their_common_parent(tmp_path, monkeypatch):
    a, b = _run(tmp_path / "x", "a", 1), _run(tmp_path / "y", "b", 2)
    monkeypatch.chdir(a)
    assert main([str(a), str(b), "--no-plots"]) == 0
    assert (tmp_path / "report" / "report.json").is_file()
    assert not (a / "report").exists()


def test_help_says_where_the_report_goes(capsys):
    try:
        main(["--help"])
    except SystemExit as e:
        assert e.code == 0
    assert "inside the folder read" in " ".join(capsys.readouterr().out.split())
