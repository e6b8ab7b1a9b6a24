"""Strong scaling (train.global_batch) and gradient accumulation (train.micro_batch), through
`python -m ddp_lab` with torchrun and real gloo process groups.

One global batch of 64, 20 steps: world 1, 2 and 4, sync=ddp and sync=ring, with and
without accumulation, must all end with the same weights (atol 1e-5), because step s of
every world size trains on the same 64 samples and the averaged gradient is the batch's
mean gradient whichever way it was summed. The runs (one torchrun each):

    ddp  world 1, micro 0  : the reference, no communication, no accumulation
    ddp  world 2, micro 16 : 2 micro-batches per rank, DDP.no_sync() on the first
    ddp  world 4, micro 16 : 16 per rank, no accumulation
    ring world 2, micro 16 : 2 micro-batches per rank, one ring all-reduce per step

(Accumulation on one rank is the same `step.accumulate` loop without a sync to defer, and
a 4-rank ring is tests/test_sync.py's: both were runs here until the suite had to shrink.)
Equal weights cannot tell an accumulation that synchronises every micro-batch (the sum of
averages is the average of sums) from one that waits for the last: the communication
counts do (summary.json comm_calls: the same per step with and without accumulation).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import run_cli, summary

COMMON = ["train.global_batch=64", "train.epochs=1", "train.max_steps_per_epoch=20",
          "timing.enabled=false", "log.progress=lines"]


def _runs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob("*/summary.json"))


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "epoch_0001.pt", map_location="cpu")["model"]


@pytest.mark.dist
@pytest.mark.slow
def test_one_global_batch_gives_the_same_weights_on_every_world_size(tmp_path, shared_data_root):
    data = f"data.root={shared_data_root}"
    commands = [
        ["sync=ddp", "launcher.nproc_per_node=1", "train.micro_batch=0"],
        ["-m", "sync=ddp", "launcher.nproc_per_node=2,4", "train.micro_batch=16"],
        ["sync=ring", "launcher.nproc_per_node=2", "train.micro_batch=16"],
    ]
    for i, args in enumerate(commands):
        proc = run_cli(*args, *COMMON, data, f"run.root={tmp_path / str(i)}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    (ref,) = _runs(tmp_path / "0")
    runs = _runs(tmp_path / "1") + _runs(tmp_path / "2")
    assert len(runs) == 3
    seen = set()
    base = _weights(ref)
    for run in [ref, *runs]:
        s = summary(run)
        w = s["world_size"]
        seen.add((s["sync"], w, s["accumulation"]))
        assert s["status"] == "completed"
        assert (s["scaling"], s["global_batch"], s["batch_size"]) == ("strong", 64, 64 // w)
        assert s["steps_run"] == 20  # steps per epoch do not depend on the world size
        got = _weights(run)
        for k in base:
            torch.testing.assert_close(got[k], base[k], rtol=0, atol=1e-5,
                                       msg=lambda m, k=k, run=run: f"{run.name} {k}: {m}")
    assert seen == {("ddp", 1, 1), ("ddp", 2, 2), ("ddp", 4, 1), ("ring", 2, 2)}

    # one synchronisation per step, accumulating or not (the MLP's gradients fit one bucket
    # in both synchronisers: the counts of a run without accumulation say how many)
    calls = {(s["sync"], s["world_size"]): s["comm_calls"] for s in map(summary, runs)}
    assert calls[("ddp", 2)] == calls[("ddp", 4)] > 0
    assert calls[("ring", 2)] == 20, calls  # one ring all-reduce of the one bucket per step


def _folder(root: Path, name: str, world: int, train: str, summary: dict) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(f"model:\n  name: mlp\ntrain:\n{train}")
    (d / "summary.json").write_text(json.dumps({"world_size": world, **summary}))


def test_the_report_groups_strong_scaling_runs_by_their_global_batch(tmp_path):
    """The report's workload (what must match for epoch times to be compared): strong
    scaling runs of one global batch share it whatever their world size; weak scaling runs
    share it by batch per rank; a strong and a weak run never do. Runs written before
    train.global_batch existed read as weak."""
    from ddp_lab.report.run import find_runs

    strong = "  global_batch: 64\n  batch_size: 64\n  micro_batch: 0\n  max_steps_per_epoch: 20\n"
    weak = "  global_batch: 0\n  batch_size: 64\n  micro_batch: 0\n  max_steps_per_epoch: 20\n"
    old = "  batch_size: 64\n  max_steps_per_epoch: 20\n"
    _folder(tmp_path, "s1", 1, strong, {"scaling": "strong", "global_batch": 64, "batch_size": 64})
    _folder(tmp_path, "s4", 4, strong, {"scaling": "strong", "global_batch": 64, "batch_size": 16})
    _folder(tmp_path, "s4_micro", 4, strong.replace("micro_batch: 0", "micro_batch: 8"), {})
    _folder(tmp_path, "w1", 1, weak, {"scaling": "weak", "global_batch": 64, "batch_size": 64})
    _folder(tmp_path, "w4", 4, weak, {"scaling": "weak", "global_batch": 256, "batch_size": 64})
    _folder(tmp_path, "old", 2, old, {"batch_size": 64})
    runs = {r.path.name: r for r in find_runs([tmp_path])}
    assert runs["s1"].workload == runs["s4"].workload
    assert runs["s4_micro"].workload != runs["s4"].workload
    assert runs["w1"].workload == runs["w4"].workload == runs["old"].workload
    assert runs["s1"].workload != runs["w1"].workload
    assert runs["s4"].workload_label() == "mlp, global batch 64 (strong scaling), 20 steps/epoch"
    assert runs["s4_micro"].workload_label() == \
        "mlp, global batch 64 (strong scaling), micro 8, 20 steps/epoch"
    assert runs["w4"].workload_label() == "mlp, batch 64/rank (weak scaling), 20 steps/epoch"


@pytest.mark.parametrize("key, was, now", [("train.global_batch", 64, 32),
                                           ("train.global_batch", 64, 0),
                                           ("train.micro_batch", 16, 8)])
def test_a_resumed_run_keeps_its_global_and_micro_batch(tmp_path, key, was, now):
    from helpers import compose
    from omegaconf import OmegaConf

    from ddp_lab.folder.rundir import reuse_problem, write_config

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "epoch_0001.pt").write_bytes(b"")  # only its name is read
    base = ["train.epochs=2", "train.global_batch=64", "train.micro_batch=16", f"run.dir={run_dir}"]
    write_config(compose(*base, f"{key}={was}"), run_dir)
    assert reuse_problem(compose(*base, f"{key}={was}")) is None
    # the world size may change (the global batch is what a step computes); these may not
    assert reuse_problem(compose(*base, f"{key}={was}", "launcher.nproc_per_node=4")) is None
    said = reuse_problem(compose(*base, f"{key}={now}"))
    assert said and f"{key}={was} (this command: {now})" in said, said
    assert OmegaConf.select(OmegaConf.load(run_dir / "config.yaml"), key) == was


def test_weak_scaling_on_another_world_asks_for_consent(tmp_path):
    """Continuing a weak-scaling run (global batch = batch x world) on another world size
    changes every later step: one line says what changes and how to consent."""
    from helpers import compose

    from ddp_lab.folder.rundir import reuse_problem, write_config

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "epoch_0001.pt").write_bytes(b"")
    base = ["train.epochs=2", f"run.dir={run_dir}"]
    write_config(compose(*base, "launcher.nproc_per_node=3"), run_dir)
    said = reuse_problem(compose(*base, "launcher.nproc_per_node=2"))
    assert said == (f"run.dir={run_dir} trained on 3 ranks, this command runs 2: under weak "
                    "scaling its global batch goes from 192 to 128 samples a step; continue "
                    "anyway with train.allow_world_change=true, or run 3 ranks (or fix the batch "
                    "with train.global_batch=192)")
    assert reuse_problem(compose(*base, "launcher.nproc_per_node=2",
                                 "train.allow_world_change=true")) is None
    assert reuse_problem(compose(*base, "launcher.nproc_per_node=3")) is None
