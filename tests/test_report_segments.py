"""The report's allocations table: one row per summary.json segment of a run that used
several allocations (a requeued SLURM job); runs with one segment add no table."""

from __future__ import annotations

import json

from test_report import _fake_run  # conftest.py puts tests/ on sys.path

from ddp_lab.report.build import build_report
from ddp_lab.report.run import find_runs


def _segment(restart, start, end, frm, to, steps, epochs, epoch_s, status):
    return {"job_id": "17", "restart": restart, "launcher": "slurm", "hosts": ["nid001", "nid002"],
            "nodes": 2, "world_size": 2, "start": start, "end": end, "start_epoch": frm[0],
            "start_step": frm[1], "end_epoch": to[0], "end_step": to[1], "epochs_done": epochs,
            "steps_done": steps, "epoch_time_s_median": epoch_s, "status": status}


def test_allocations_table(tmp_path):
    run = _fake_run(tmp_path / "runs", "requeued", 2, 10.0)
    s = json.loads((run / "summary.json").read_text())
    s["segments"] = [
        _segment(0, "2026-11-23T11:00:00+00:00", "2026-11-23T11:00:50+00:00", (0, 0), (1, 40),
                 140, 1, 9.5, "preempted"),
        _segment(1, "2026-11-23T11:03:00+00:00", "2026-11-23T11:03:15+00:00", (1, 40), (2, 0),
                 60, 1, 12.25, "completed")]
    (run / "summary.json").write_text(json.dumps(s))
    _fake_run(tmp_path / "runs", "single", 1, 20.0)  # one segment: no rows
    doc = build_report(find_runs([tmp_path / "runs"]), tmp_path / "out", make_plots=False)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Allocations of runs that used several" in md
    assert ("| `requeued` | 1 | 17 | 0 | 2 | nid001,nid002 | 2026-11-23T11:00:00+00:00 | 50 | "
            "epoch 0 | epoch 1 + 40 steps | 140 | 1 | 9.50 | preempted |") in md, md
    assert "| `requeued` | 2 | 17 | 1 | 2 |" in md and "| 15 | epoch 1 + 40 steps | epoch 2 | 60 | 1 | 12.25 | completed |" in md
    assert "`single`" not in md.split("## Allocations")[1].split("##")[0]
    rows = json.loads((tmp_path / "out" / "report.json").read_text())["segments"]
    assert [r["segment"] for r in rows] == [1, 2] and rows[0]["wall_s"] == 50.0
    assert doc is not None


def test_memory_table_shows_the_sharded_optimiser_state(tmp_path):
    """Runs that recorded what a rank holds get a row each in report.md's memory table and
    report.json's `memory`: zero1's optimiser state beside ddp's."""
    for name, sync, world, state in (("ddp2", "ddp", 2, 80_170_000), ("zero2", "zero1", 2, 40_085_000),
                                     ("zero4", "zero1", 4, 20_042_500)):
        run = _fake_run(tmp_path / "runs", name, world, 10.0)
        s = json.loads((run / "summary.json").read_text())
        s.update(sync=sync, model="mlp_wide", memory_param_bytes=40_085_000,
                 memory_grad_bytes=40_085_000, memory_optimizer_state_bytes=state)
        (run / "summary.json").write_text(json.dumps(s))
    build_report(find_runs([tmp_path / "runs"]), tmp_path / "out", make_plots=False)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Memory per rank" in md
    assert "| mlp_wide | 4 | zero1 | 40.1 | 40.1 | 20.0 |" in md, md
    rows = json.loads((tmp_path / "out" / "report.json").read_text())["memory"]
    assert [(r["sync"], r["world_size"]) for r in rows] == [("ddp", 2), ("zero1", 2), ("zero1", 4)]
