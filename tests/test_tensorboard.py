"""TensorBoard as people use it (issue 21), read back through TensorBoard's own code (its
EventAccumulator, the HParams plugin's ordering): one run per training, one global-step
axis with `epoch` a scalar of its own, the custom-scalars layout, hparams with the keys
that vary first, per-step points on disk while the epoch runs, and a run stopped
mid-epoch and resumed on one continuous axis."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from ddp_lab.run.tensorboard import VARYING, run_name
from helpers import compose, summary, tensorboard
from test_failures import _clean_up, _finish, _start, _training


def _telemetry(run_dir: Path, *overrides: str, steps_per_epoch: int = 2):
    """A one-rank Telemetry as the loop drives it (no process group)."""
    from ddp_lab.distributed import DistContext
    from ddp_lab.env import DistEnv
    from ddp_lab.run.telemetry import Telemetry

    cfg = compose("launcher=local", "sync=ring", "model=mlp", "optim=adam", "train.batch_size=2",
                  "train.lr=0.1", "log.progress=lines", "timing.trace=false", *overrides)
    ctx = DistContext(env=DistEnv(0, 0, 1, 1, 0, 1, "127.0.0.1", 1, "test"), backend="gloo",
                      device=torch.device("cpu"))
    return Telemetry(cfg, ctx, run_dir, steps_per_epoch=steps_per_epoch, bytes_exact=True)


def _epoch(n: int, steps: list | None = None, at: int = 0):
    from ddp_lab.run.epoch import MeasuredEpoch
    from ddp_lab.timing import CommStats

    return MeasuredEpoch(n, steps or [], CommStats(), busy_s=0.01, wall_s=0.1, loss_sum=2.0,
                         samples=4, resumed_at_step=at, test=(0.5, 0.9))


def _points(acc, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_run_name_says_what_tells_runs_apart():
    base = {"sync": "ring", "world_size": 4, "nodes": 1, "compress": "none", "overlap": False,
            "model": "mlp"}
    assert run_name(base) == "ring_w4_mlp"
    assert run_name({**base, "compress": "fp16", "overlap": True, "world_size": 8, "nodes": 2},
                    repeat=3) == "ring-fp16-overlap_w8n2_mlp_r3"
    assert run_name({**base, "sync": "ddp", "overlap": True}) == "ddp_w4_mlp"  # ddp always overlaps


def test_one_run_its_head_once_and_every_epoch_on_the_global_step_axis(tmp_path):
    """Three segments of one run (stopped mid-epoch 1, resumed, continued for a second
    epoch): one TensorBoard run whose config, layout and hparams were written once, at
    step 0; each epoch's scalars, `epoch` and hparam metrics at its last step."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.plugins.hparams import metadata
    from tensorboard.plugins.hparams.backend_context import _sort_and_reduce_to_hparams_limit

    tel = _telemetry(tmp_path, "train.epochs=1", "timing.enabled=false")
    tel.start(0, 0)
    tel.finish(status="preempted", position=(0, 1))  # stopped one step into epoch 1
    tel = _telemetry(tmp_path, "train.epochs=1", "timing.enabled=false")
    tel.start(0, 1)
    tel.epoch(_epoch(1, at=1))
    tel.finish()
    tel = _telemetry(tmp_path, "train.epochs=2", "timing.enabled=false")
    tel.start(1, 0)
    tel.epoch(_epoch(2))
    tel.finish()

    acc = tensorboard(tmp_path)
    assert acc.path == str(tmp_path / "tb" / "ring_w1_mlp")
    assert _points(acc, "epoch") == [(2, 1.0), (4, 2.0)]  # 2 steps per epoch
    assert [s for s, _ in _points(acc, "loss/train")] == [2, 4]
    assert [s for s, _ in _points(acc, "hparam/test_accuracy")] == [2, 4]
    assert [e.step for e in acc.Tensors("config/text_summary")] == [0]

    # custom scalars: compute, comm in flight and exposed comm on one chart
    (layout_event,) = acc.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(layout_event.tensor_proto.string_val[0])
    charts = {c.title: list(c.multiline.tag) for cat in layout.category for c in cat.chart}
    chart = charts["per epoch (ms/step): compute, comm in flight, comm exposed"]
    assert chart == [r"^time/compute\[ms/step\]$", r"^comm/inflight\[ms/step\]$",
                     r"^comm/exposed\[ms/step\]$"]

    # hparams: written once; the HParams plugin's own ordering puts the varying keys first
    # (its dashboard ticks the first five)
    starts = sum(v.tag == metadata.SESSION_START_INFO_TAG for f in (tmp_path / "tb").rglob("events.*")
                 for e in EventFileLoader(str(f)).Load() for v in e.summary.value)
    assert starts == 1
    experiment = metadata.parse_experiment_plugin_data(
        acc.SummaryMetadata(metadata.EXPERIMENT_TAG).plugin_data.content)
    assert [h.name for h in experiment.hparam_infos][:2] == ["sync", "world_size"]
    _sort_and_reduce_to_hparams_limit(experiment, 5)
    assert {h.name for h in experiment.hparam_infos} == set(VARYING)
    session = metadata.parse_session_start_info_plugin_data(
        acc.SummaryMetadata(metadata.SESSION_START_INFO_TAG).plugin_data.content)
    assert session.hparams["sync"].string_value == "ring"
    assert session.hparams["world_size"].number_value == 1
    assert [m.name.tag for m in experiment.metric_infos] == [
        "hparam/test_accuracy", "hparam/epoch_time_s", "hparam/comm_fraction", "hparam/busbw_GBps"]


def test_per_step_points_share_the_axis_with_the_epoch(tmp_path):
    """Without a live watch (as here) the epoch's end writes the per-step points: every
    2nd of 4 steps at its global step, the epoch's scalars at its last, `epoch` once there."""
    from ddp_lab.timing import PHASES, StepTimes

    tel = _telemetry(tmp_path, "train.epochs=1", "timing.tb_every=2", steps_per_epoch=4)
    tel.start(0, 0)
    steps = [StepTimes([(p, (5 * i + k) * 1e-3, (5 * i + k + 1) * 1e-3) for k, p in enumerate(PHASES)])
             for i in range(4)]
    tel.epoch(_epoch(1, steps))
    tel.finish()
    acc = tensorboard(tmp_path)
    assert _points(acc, "step/time[ms]") == [(2, pytest.approx(5.0)), (4, pytest.approx(5.0))]
    assert _points(acc, "epoch") == [(2, 1.0), (4, 1.0)]
    assert [s for s, _ in _points(acc, "time/step[ms/step]")] == [4]
    tags = set(acc.Tags()["scalars"])
    assert {"step/compute[ms]", "step/comm[ms]", "step/comm_exposed[ms]"} <= tags
    assert not [t for t in tags if "(" in t]  # custom scalars would draw them invisible


def test_a_fresh_start_hides_what_a_former_attempt_wrote(tmp_path):
    """A run started again from step 0 (its first attempt died before any checkpoint)
    goes on in the same folder and shows only its own points, its head once."""
    for _ in range(2):
        tel = _telemetry(tmp_path, "train.epochs=1", "timing.enabled=false")
        tel.start(0, 0)
        tel.epoch(_epoch(1))
        tel.finish()
    acc = tensorboard(tmp_path)
    assert _points(acc, "epoch") == [(2, 1.0)]
    assert [e.step for e in acc.Tensors("config/text_summary")] == [0]


@pytest.mark.dist
@pytest.mark.slow
def test_live_then_sigterm_and_resume_keep_one_continuous_axis(tmp_path, shared_data_root):
    """A 2-rank run as a user runs it: per-step points are on disk while the first epoch
    runs; SIGTERM stops it mid-epoch, the same command continues it, and TensorBoard
    shows one run whose every tag has each step once, per-step points every 5 steps."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    args = ("train.epochs=2", "train.max_steps_per_epoch=150", "train.stop_check_s=0.2",
            "timing.tb_every=5", "debug.slow_rank=0", "debug.slow_ms=30",  # ~5 s an epoch
            f"data.root={shared_data_root}")
    proc = _start(run_dir, *args, world=2)
    try:
        _training(run_dir, proc, steps=20, world=2)
        deadline, tags = time.monotonic() + 30, {}
        while time.monotonic() < deadline and "step/time[ms]" not in tags.get("scalars", []):
            folders = {p.parent for p in (run_dir / "tb").rglob("events.out.tfevents.*")}
            if folders:
                live = EventAccumulator(str(folders.pop()))
                live.Reload()
                tags = live.Tags()
            time.sleep(0.2)
        assert "step/time[ms]" in tags["scalars"], tags
        assert "loss/train" not in tags["scalars"]  # seen before the first epoch ended
        os.kill(proc.pid, signal.SIGTERM)
        out, err = _finish(proc, 120)
        s = summary(run_dir)
        assert s["status"] == "stopped", f"{s['status']}\n{out[-3000:]}\n{err[-3000:]}"
        stopped_at = (s["epochs_done"], s["step_in_epoch"])
        again = _start(run_dir, *args, world=2)
        out, err = _finish(again, 300)
        assert again.returncode == 0, f"{out[-3000:]}\n{err[-3000:]}"
    finally:
        _clean_up(proc, run_dir)
    acc = tensorboard(run_dir)  # one run in tb/
    assert acc.path.endswith("/tb/ddp_w2_mlp")
    for tag in acc.Tags()["scalars"]:
        steps = [e.step for e in acc.Scalars(tag)]
        assert steps == sorted(set(steps)), (tag, steps, stopped_at)
    assert [s for s, _ in _points(acc, "step/time[ms]")] == list(range(5, 301, 5)), stopped_at
    assert [s for s, _ in _points(acc, "loss/train")] == [150, 300]
    assert all(v == (1.0 if s <= 150 else 2.0) for s, v in _points(acc, "epoch"))
    print(f"stopped at epoch {stopped_at[0]} step {stopped_at[1]}: one continuous axis")
