"""The short part of the suite that runs on the oldest torch ddp_lab supports (.ci/run's
last step, scripts/oldest_torch.sh, builds a second venv with it from the registry and runs
this file, tests/test_one_file.py and the forked ranks' end there). Not named test_*.py: the
main run leaves it out (the synchronisers' runs are covered there by their own tests), and
`pytest tests/oldest_torch.py` runs it on any torch: every synchroniser trains a local run to its end with the
defaults, a finished run's folder continues for another epoch (a resume), the report
compares the runs; where the installed torch lacks what a default asks for, the run's
first lines say what was chosen instead.
"""

from __future__ import annotations

import json

import pytest

from ddp_lab.world import torch_support
from ddp_lab.sync import SYNCS

from helpers import describe, run_cli, summary

pytestmark = [pytest.mark.dist, pytest.mark.slow]

#: every synchroniser this torch can run (sync=fsdp2 needs torch.distributed.fsdp.fully_shard,
#: torch >= 2.6: on an older torch it is refused, test_fsdp2_on_a_torch_without_it_...)
RUNNABLE = [n for n in SYNCS if n != "fsdp2" or torch_support.has_fully_shard()]

STEPS = ["train.epochs=1", "train.max_steps_per_epoch=8", "train.eval_batch_size=2000",
         "log.progress=lines", "launcher.nproc_per_node=2"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, shared_data_root):
    """Every synchroniser, one job after another (a -m sweep: one command)."""
    root = tmp_path_factory.mktemp("syncs")
    proc = run_cli("-m", f"sync={','.join(sorted(RUNNABLE))}", *STEPS, f"run.root={root}",
                   f"data.root={shared_data_root}", cwd=root, timeout=600)
    return root, proc


def test_every_synchroniser_trains_to_its_end(sweep):
    root, proc = sweep
    assert proc.returncode == 0, describe(proc)
    for name in RUNNABLE:
        run_dir, = root.glob(f"{name}_*")  # a sweep names each job by its value
        s = summary(run_dir)
        assert s["status"] == "completed" and s["sync"] == name and s["world_size"] == 2, s
        assert 0.3 < s["test_accuracy"] <= 1, (name, s["test_accuracy"])


def test_the_first_lines_say_what_the_installed_torch_made_a_default_choose(sweep):
    root, proc = sweep
    note = "optim.fused=null: the per-tensor loop (torch "
    lacks = not torch_support.has_fused("adam", "cpu")
    assert (note in proc.stdout) == lacks, describe(proc)
    if lacks:  # among the run's first lines: before its first epoch's
        lines = proc.stdout.splitlines()
        first_note = next(i for i, ln in enumerate(lines) if note in ln)
        first_epoch = next(i for i, ln in enumerate(lines) if "epoch 1/1" in ln)
        assert first_note < first_epoch


def test_a_finished_run_continues_for_another_epoch_and_the_report_compares(sweep, tmp_path,
                                                                           shared_data_root):
    root, _ = sweep
    run_dir, = root.glob("ring_*")
    proc = run_cli("sync=ring", *STEPS[1:], "train.epochs=2", f"run.dir={run_dir}",
                   f"data.root={shared_data_root}", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, describe(proc)
    s = summary(run_dir)
    assert s["status"] == "completed" and s["start_epoch"] == 1 and s["epochs_run"] == 1, s
    epochs = [json.loads(ln)["epoch"] for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2]

    # zero1 apart: the report's forecast of it fails on its own (reduce_scatter of
    # 159040 elements "do not split into 128 pieces"), on every torch
    compared = [n for n in RUNNABLE if n != "zero1"]
    proc = run_cli(*sorted(str(p) for n in compared for p in root.glob(f"{n}_*")),
                   module="ddp_lab.report", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, describe(proc)
    for name in compared:
        assert name in proc.stdout, describe(proc)


def test_fused_true_where_torch_has_none_is_refused_in_one_line(tmp_path):
    proc = run_cli("optim.fused=true", "dist.device=cpu", "launcher.dry_run=true",
                   f"run.root={tmp_path}", cwd=tmp_path)
    if torch_support.has_fused("adam", "cpu"):
        assert proc.returncode == 0, describe(proc)
    else:
        assert proc.returncode == 2, describe(proc)
        assert proc.stderr.strip() == (
            f"error: optim.fused=true: torch {torch_support.version()} has no fused adam update "
            "on cpu (torch >= 2.4 has): leave optim.fused=null (fused where torch has it) or "
            "set optim.fused=false"), describe(proc)
        assert not any(tmp_path.iterdir())  # refused before a run folder was made


def test_fsdp2_on_a_torch_without_fully_shard_is_refused_in_one_line(tmp_path):
    proc = run_cli("sync=fsdp2", "dist.device=cpu", "launcher.nproc_per_node=2",
                   "launcher.dry_run=true", f"run.root={tmp_path}", cwd=tmp_path)
    if torch_support.has_fully_shard():
        assert proc.returncode == 0 and torch_support.fsdp2_refusal() is None, describe(proc)
        return
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip() == (
        f"error: sync=fsdp2: torch {torch_support.version()} has no "
        "torch.distributed.fsdp.fully_shard (FSDP2, torch >= 2.6): use sync=zero1 or "
        "sync=torch_zero (sharded optimiser state on this torch), or a torch >= 2.6"), describe(proc)
    assert not any(tmp_path.iterdir())  # refused before a run folder was made
