"""TensorBoard as people use it (issue 21), read back through TensorBoard's own code (its
EventAccumulator, the HParams plugin's ordering): one run per training, one global-step
axis with `epoch` a scalar of its own, the custom-scalars layout, hparams with the keys
that vary first, per-step points on disk while the epoch runs, and a run stopped
mid-epoch and resumed on one continuous axis."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from ddp_lab.folder.tensorboard import ONE_RUN, compare_categories
from ddp_lab.folder.tensorboard import BANDS, band_tag, run_name, workload
from helpers import compose, summary, tensorboard
from test_failures import _clean_up, _finish, _start, _training


def _telemetry(run_dir: Path, *overrides: str, steps_per_epoch: int = 2, world: int = 1):
    """A one-rank Telemetry as the loop drives it (no process group)."""
    from ddp_lab.world.distributed import DistContext
    from ddp_lab.world.env import DistEnv
    from ddp_lab.rank.records import Telemetry

    cfg = compose("launcher=local", "sync=ring", "model=mlp", "optim=adam", "train.batch_size=2",
                  "train.lr=0.1", "log.progress=lines", "timing.trace=false", *overrides)
    ctx = DistContext(env=DistEnv(0, 0, world, world, 0, 1, "127.0.0.1", 1, "test"), backend="gloo",
                      device=torch.device("cpu"))
    return Telemetry(cfg, ctx, run_dir, steps_per_epoch=steps_per_epoch, bytes_exact=True)


def _epoch(n: int, steps: list | None = None, at: int = 0):
    from ddp_lab.rank.records import MeasuredEpoch
    from ddp_lab.timing import CommStats

    return MeasuredEpoch(n, steps or [], CommStats(), busy_s=0.01, wall_s=0.1, loss_sum=2.0,
                         samples=4, resumed_at_step=at, test=(0.5, 0.9))


def _points(acc, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_run_name_says_what_tells_runs_apart():
    base = {"sync": "ring", "world_size": 4, "nodes": 1, "compress": "none", "overlap": False,
            "model": "mlp", "optim": "adam", "launcher": "local"}
    assert run_name(base) == "ring_w4_mlp"
    assert run_name({**base, "compress": "fp16", "overlap": True, "world_size": 8, "nodes": 2},
                    repeat=3) == "ring-overlap-fp16_w8n2_mlp_r3"
    # every option of the sync's group that is not its default (folder/description.py)
    assert run_name({**base, "sync.prepost": True, "world_size": 2}) == "ring-prepost_w2_mlp"
    assert run_name({**base, "sync": "ddp", "overlap": True}) == "ddp_w4_mlp"  # ddp always overlaps
    # a non-default group is named: an optim=sgd run is not named as the default one
    assert run_name({**base, "optim": "sgd", "launcher": "slurm"}) == "ring_w4_mlp_sgd_slurm"


def _hparams_experiment(logdir: Path, limit: int | None = 5):
    """The experiment the HParams dashboard gets for `logdir`, through TensorBoard's own
    backend (its data provider over the event files), with the five hparams it ticks
    first (`limit=5`: its dashboard ticks the first five)."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import backend_context

    mux = plugin_event_multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, str(logdir))
    ctx = backend_context.Context(base_plugin.TBContext(logdir=str(logdir), multiplexer=mux,
                                                        data_provider=provider))
    rc = context.RequestContext()
    return ctx.experiment_from_metadata(rc, "", True, ctx.hparams_metadata(rc, ""),
                                        ctx.hparams_from_data_provider(rc, "", None), hparams_limit=limit)


def test_hparams_tick_what_differs_and_show_integers_as_integers(tmp_path):
    """Two runs that differ in the optimiser only (as `-m optim=adam,sgd` makes them): the
    HParams dashboard ticks it among its first five (`~optim`: not a setting, so it sorts
    after the settings), shows the world size as `1` (not 1.0000), has no `overlap` or
    `compress` beside the sync's own options, and the run's figures first among the metrics."""
    from tensorboard.plugins.hparams import api_pb2, metadata

    for optim in ("adam", "sgd"):
        tel = _telemetry(tmp_path / optim, "train.epochs=1", "timing.enabled=false", f"optim={optim}")
        tel.start(0, 0)
        tel.epoch(_epoch(1))
        tel.finish()
    experiment = _hparams_experiment(tmp_path)
    ticked = [h.name for h in experiment.hparam_infos]
    assert ticked[0] == "~optim" and experiment.hparam_infos[0].differs, ticked
    assert [h.name for h in experiment.hparam_infos if h.differs] == ["~optim"]
    every = {h.name: h for h in _hparams_experiment(tmp_path, limit=None).hparam_infos}
    assert every["world_size"].type == api_pb2.DATA_TYPE_STRING
    assert list(every["world_size"].domain_discrete.values[0].string_value) == list("1")
    assert not {"overlap", "~overlap", "compress", "~compress"} & set(every), sorted(every)
    acc = tensorboard(tmp_path / "sgd")
    assert acc.path.endswith("/tb/ring_w1_mlp_sgd_b2_lr0.1_full")  # what is not the default
    session = metadata.parse_session_start_info_plugin_data(
        acc.SummaryMetadata(metadata.SESSION_START_INFO_TAG).plugin_data.content)
    assert session.hparams["world_size"].string_value == "1"  # shown as 1, not 1.0000
    assert session.hparams["~lr"].number_value == 0.1
    metrics = [m.name.tag for m in experiment.metric_infos][:5]  # the five it shows
    assert metrics == ["Run/busbw[GB/s]", "Run/comm_fraction", "Run/epoch_time_median[s]",
                       "Run/test_accuracy", "accuracy/test[fraction]"]


def test_one_run_its_head_once_and_every_epoch_on_the_global_step_axis(tmp_path):
    """Three segments of one run (stopped mid-epoch 1, resumed, continued for a second
    epoch): one TensorBoard run whose config, layout and hparams were written once, at
    step 0; each epoch's scalars, `epoch` and hparam metrics at its last step."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import metadata

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
    assert acc.path == str(tmp_path / "tb" / "ring_w1_mlp_b2_lr0.1_full")
    assert _points(acc, "epoch") == [(2, 1.0), (4, 2.0)]  # 2 steps per epoch
    assert [s for s, _ in _points(acc, "loss/train")] == [2, 4]
    assert [e.step for e in acc.Tensors("config/text_summary")] == [0]

    # hparams: the session start once, and no experiment of its own (the plugin works it
    # out from every run's session start: test_hparams_tick_what_differs...)
    starts = sum(v.tag == metadata.SESSION_START_INFO_TAG for f in (tmp_path / "tb").rglob("events.*")
                 for e in EventFileLoader(str(f)).Load() for v in e.summary.value)
    assert starts == 1
    assert metadata.EXPERIMENT_TAG not in acc.Tags()["tensors"]
    assert [s for s, _ in _points(acc, "Run/test_accuracy")] == [2, 4]


def _one_timed_epoch(tmp_path, every: int, steps: int, epochs: int = 1):
    """The first epoch, of `steps` steps of 5 ms (1 ms a phase), of an `epochs`-epoch run
    through Telemetry, every `every`-th step to TensorBoard; its event file read back."""
    from ddp_lab.timing import PHASES, StepTimes

    tel = _telemetry(tmp_path, f"train.epochs={epochs}", f"timing.tb_every={every}",
                     steps_per_epoch=steps)
    tel.start(0, 0)
    times = [StepTimes([(p, (5 * i + k) * 1e-3, (5 * i + k + 1) * 1e-3) for k, p in enumerate(PHASES)])
             for i in range(steps)]
    tel.epoch(_epoch(1, times))
    tel.finish()
    return tensorboard(tmp_path)


def test_per_step_points_share_the_axis_with_the_epoch(tmp_path):
    """Without a live watch (as here) the epoch's end writes the per-step points: every
    2nd of 40 steps at its global step, the epoch's scalars at its last, `epoch` once there."""
    acc = _one_timed_epoch(tmp_path, every=2, steps=40)
    assert _points(acc, "step/time[ms]") == [(n, pytest.approx(5.0)) for n in range(2, 41, 2)]
    assert _points(acc, "epoch") == [(n, 1.0) for n in range(2, 41, 2)]
    assert [s for s, _ in _points(acc, "time/step[ms/step]")] == [40]
    tags = set(acc.Tags()["scalars"])
    assert {"step/compute[ms]", "step/comm[ms]", "step/comm_exposed[ms]"} <= tags
    assert not [t for t in tags if "(" in t]  # custom scalars would draw them invisible


def test_the_layout_tells_compute_and_comm_apart(tmp_path):
    """Every chart of the custom-scalars layout, read back from the event file, draws tags
    the run wrote. Where runs are compared, a chart holds one quantity (TensorBoard gives
    a run's lines one colour: compute and comm on one multiline chart differ by marker
    only); one run's compute and comm share a margin chart, compute the line and comm in
    flight the band, which ends where the exposed comm ends."""
    from tensorboard.plugins.custom_scalar import layout_pb2

    acc = _one_timed_epoch(tmp_path, every=1, steps=2, epochs=2)
    (event,) = acc.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(event.tensor_proto.string_val[0])
    assert [(c.title, c.closed) for c in layout.category] == \
        [(t, closed) for t, closed, _ in compare_categories(workload(_telemetry(tmp_path).hparams()))] \
        + [(t, True) for _, t, *_ in ONE_RUN]  # the one-run charts: folded
    tags = set(acc.Tags()["scalars"])
    margins = 0
    for chart in (c for cat in layout.category for c in cat.chart):
        if chart.HasField("margin"):
            margins += 1
            (series,) = chart.margin.series
            value, low, high = (_points(acc, t) for t in (series.value, series.lower, series.upper))
            assert [s for s, _ in value] == [s for s, _ in low] == [s for s, _ in high] != []
            assert all(lo <= hi for (_, lo), (_, hi) in zip(low, high))
            continue
        (rx,) = chart.multiline.tag  # one quantity a chart
        assert any(re.match(rx, t) for t in tags), (chart.title, rx)
    assert margins == 2
    # the band: in flight long, ending at compute + exposed; its line: compute
    for (compute, inflight, exposed), names in BANDS.items():
        line, low, high = (band_tag(tmp_path.name, n) for n in names)
        for (s, c), (_, i), (_, e), (_, ln), (_, lo), (_, hi) in zip(*(_points(acc, t) for t in (
                compute, inflight, exposed, line, low, high))):
            assert ln == c and hi == pytest.approx(c + e, abs=1e-4)
            assert lo == pytest.approx(max(0.0, c + e - i), abs=1e-4)


def _custom_scalars(logdir: Path):
    """The custom-scalars layout TensorBoard serves for `logdir` (its plugin merges the
    runs' layouts) and the scalar tags of each of its runs."""
    from tensorboard import context
    from tensorboard.backend.event_processing import plugin_event_multiplexer as pem
    from tensorboard.backend.event_processing.data_provider import MultiplexerDataProvider
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.custom_scalar.custom_scalars_plugin import CustomScalarsPlugin

    mux = pem.EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    plugin = CustomScalarsPlugin(base_plugin.TBContext(
        logdir=str(logdir), multiplexer=mux, data_provider=MultiplexerDataProvider(mux, str(logdir))))
    layout = json.loads(plugin.layout_impl(context.RequestContext(), ""))
    return layout, {run: set(tags) for run, tags in mux.PluginRunToTagToContent("scalars").items()}


def test_one_run_charts_stay_one_run_each_among_many(tmp_path):
    """Three runs in one folder, as TensorBoard serves them: the one-run margin charts are
    one per run, each drawing that run's band only (on tags every run shared, each chart
    drew every run's band: with 15 runs a pile of translucent bands)."""
    for k in range(3):
        _one_timed_epoch(tmp_path / f"ring_run{k}", every=1, steps=20)
    layout, tags = _custom_scalars(tmp_path)
    assert len(tags) == 3
    margins = [c for cat in layout["category"] for c in cat.get("chart", []) if "margin" in c]
    assert len(margins) == 3  # per step; one epoch draws no line: no per-epoch chart
    for chart in margins:
        (series,) = chart["margin"]["series"]
        having = [run for run, t in tags.items() if series["value"] in t]
        assert len(having) == 1 and {series["lower"], series["upper"]} <= tags[having[0]], chart
        assert having[0].split("/")[0] in chart["title"], (chart["title"], having)


def test_a_short_run_draws_per_step_points(tmp_path):
    """A 20-step run at the default timing.tb_every (50) writes a point every step, so its
    per-step charts draw lines (every 50th step of 20: none, and the one epoch point
    alone drew nothing)."""
    from tensorboard.plugins.custom_scalar import layout_pb2

    from ddp_lab.config import TimingConfig

    assert TimingConfig().tb_every > 20
    acc = _one_timed_epoch(tmp_path, every=TimingConfig().tb_every, steps=20)
    assert [s for s, _ in _points(acc, "step/time[ms]")] == list(range(1, 21))
    (event,) = acc.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(event.tensor_proto.string_val[0])
    (chart,) = [c for cat in layout.category for c in cat.chart if c.HasField("margin")]
    assert chart.title.endswith("per step (ms)")  # its one epoch point would draw no line
    assert len(_points(acc, chart.margin.series[0].value)) == 20


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
    shows one run whose every tag has each step once, per-step points every 5 steps, each
    from a step whose phases were stamped (300 steps an epoch: the phases are sampled)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    args = ("train.epochs=2", "train.max_steps_per_epoch=300", "train.stop_check_s=0.2",
            "timing.tb_every=5", "debug.slow_rank=0", "debug.slow_ms=20",  # ~6 s an epoch
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
    assert acc.path.endswith("/tb/ddp_w2_mlp_300steps_slow0-20ms")
    for tag in acc.Tags()["scalars"]:
        steps = [e.step for e in acc.Scalars(tag)]
        assert steps == sorted(set(steps)), (tag, steps, stopped_at)
    assert [s for s, _ in _points(acc, "step/time[ms]")] == list(range(5, 601, 5)), stopped_at
    # rank 0's injected 20 ms is compute; a step without its phases would show no sync
    assert all(v > 0 for _, v in _points(acc, "step/sync[ms]"))
    assert all(v >= 20 for _, v in _points(acc, "step/compute[ms]"))
    assert [s for s, _ in _points(acc, "loss/train")] == [300, 600]
    assert all(v == (1.0 if s <= 300 else 2.0) for s, v in _points(acc, "epoch"))
    # the second epoch ran whole in the second allocation: its phases rest on a sample
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["epoch"] == 2 and 64 <= last["steps_sampled"] < 300, last["steps_sampled"]
    print(f"stopped at epoch {stopped_at[0]} step {stopped_at[1]}: one continuous axis")


def _timed_run(run_dir: Path, *overrides: str, steps: int, epochs: int, world: int = 1,
               resumed_from: int = 0) -> None:
    """A run of `epochs` epochs of `steps` steps of 5 ms (1 ms a phase) through Telemetry, a
    per-step point every step; `resumed_from`: its first segment ran that many epochs and
    stopped, and a second one (train.epochs raised) continued it."""
    from ddp_lab.timing import PHASES, StepTimes

    times = [StepTimes([(p, (5 * i + k) * 1e-3, (5 * i + k + 1) * 1e-3) for k, p in enumerate(PHASES)])
             for i in range(steps)]
    segments = [(0, resumed_from), (resumed_from, epochs)] if resumed_from else [(0, epochs)]
    for first, last in segments:
        tel = _telemetry(run_dir, f"train.epochs={last}", "timing.tb_every=1",
                         f"train.max_steps_per_epoch={steps}", *overrides,
                         steps_per_epoch=steps, world=world)
        tel.start(first, 0)
        for e in range(first + 1, last + 1):
            tel.epoch(_epoch(e, times))
        tel.finish()


def test_runs_of_any_length_compare_on_the_epoch_and_the_step_within_it(tmp_path):
    """Four runs of one workload in one folder (two syncs, worlds 1 and 2, 4 and 8 steps per
    epoch, 2 or 3 epochs, one resumed), as TensorBoard's own plugin serves them: the
    workload's comparison chart of time per epoch has every run as a line on x = the epoch,
    and its per-step charts put each step at its place within its epoch, so a long run does
    not squeeze a short one; the one-run band charts are folded; the TensorBoard run names
    are unique and hold the label once; HParams ticks sync and world_size among its first
    five, and the resumed run's hparams say its epochs now."""
    from tensorboard.plugins.hparams import metadata

    runs = {"ring": dict(steps=4, epochs=2, world=1), "allreduce": dict(steps=8, epochs=3, world=2),
            "ring2": dict(steps=8, epochs=2, world=2), "allreduce1": dict(steps=4, epochs=2, world=1,
                                                                         resumed_from=1)}
    labels, folders = {}, {}
    for k, (name, spec) in enumerate(runs.items()):
        sync = name.rstrip("12")
        labels[name] = run_name(_telemetry(tmp_path / "probe", f"sync={sync}", world=spec["world"]).hparams())
        folders[f"{labels[name]}_2026-01-01_00-00-0{k}"] = spec
        _timed_run(tmp_path / f"{labels[name]}_2026-01-01_00-00-0{k}", f"sync={sync}", **spec)
    layout, tags = _custom_scalars(tmp_path)
    names = sorted(tags)
    assert len(set(names)) == 4, names
    for run in names:  # `<run folder>/tb/<what the folder's name does not say>`
        folder, tb, tail = run.split("/")
        assert tb == "tb" and tail == f"{folders[folder]['steps']}steps", run

    from tensorboard.backend.event_processing import plugin_event_multiplexer as pem
    from tensorboard.util import tensor_util

    mux = pem.EventMultiplexer()
    mux.AddRunsFromDirectory(str(tmp_path))
    mux.Reload()
    by_epoch, by_step, *one_run = layout["category"]
    assert by_epoch["title"].endswith("x = epoch (a line per run)") and not by_epoch.get("closed")
    assert all(c.get("closed") for c in one_run) and len(one_run) == 2  # folded
    (chart,) = [c for c in by_epoch["chart"] if c["title"] == "time per epoch (s)"]
    (rx,) = chart["multiline"]["tag"]
    for run in names:
        (tag,) = [t for t in tags[run] if re.match(rx, t)]  # the same tag in every run
        points = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in mux.Tensors(run, tag)]
        epochs = folders[run.split("/")[0]]["epochs"]
        assert points == [(e, pytest.approx(0.1)) for e in range(1, epochs + 1)], (run, points)  # x: the epoch
    (chart,) = [c for c in by_step["chart"] if c["title"] == "compute (ms)"]
    (rx,) = chart["multiline"]["tag"]
    for run in names:
        steps = folders[run.split("/")[0]]["steps"]
        matched = sorted(t for t in tags[run] if re.match(rx, t))
        assert matched and matched[0].endswith("/e1"), matched  # a line per epoch
        for tag in matched:
            assert [e.step for e in mux.Tensors(run, tag)] == list(range(1, steps + 1)), (run, tag)

    experiment = _hparams_experiment(tmp_path)  # the five it ticks
    ticked = {h.name: h.differs for h in experiment.hparam_infos}
    assert ticked.get("sync") and ticked.get("world_size"), ticked
    (resumed,) = [r for r in names if r.startswith(f"{labels['allreduce1']}_2026-01-01_00-00-03/")]
    acc = mux.GetAccumulator(resumed)
    session = metadata.parse_session_start_info_plugin_data(
        acc.SummaryMetadata(metadata.SESSION_START_INFO_TAG).plugin_data.content)
    assert session.hparams["~epochs"].string_value == "2"  # not the first segment's 1


def python_crc(data: bytes) -> int:
    """TensorBoard's own CRC-32C, called past the name `checksum_in_c` replaces."""
    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow as stub

    return stub.crc_finalize(stub.crc_update(stub.CRC_INIT, data))


def test_the_event_checksum_in_c_is_tensorboards_own(tmp_path):
    """ddp_lab hands TensorBoard's record writer a C CRC-32C (google-crc32c) for its pure-Python
    one: the same checksum over sizes that are not multiples of anything, and an event file the
    writer then writes checks out record by record against TensorBoard's own Python CRC."""
    import os
    import struct

    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow as stub

    from ddp_lab.folder.tensorboard import TensorBoardRun, checksum_in_c

    def masked(data: bytes) -> int:  # TFRecord's mask, as tensorboard's masked_crc32c applies it
        x = python_crc(data)
        return (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    checksum_in_c()
    assert stub.crc32c is not python_crc and stub.crc32c.__module__.startswith("google_crc32c")
    for n in (0, 1, 7, 200, 4099):
        data = os.urandom(n)
        assert stub.crc32c(data) == python_crc(data), n

    run = TensorBoardRun(tmp_path / "tb", "w1")
    for step in range(1, 4):
        run.scalars(step, {"loss/train": 1.0 / step, "step/time[ms]": 3.0 + step})
    run.close()
    (path,) = (tmp_path / "tb").rglob("events.out.tfevents.*")
    blob, at, records = path.read_bytes(), 0, 0
    while at < len(blob):
        header = blob[at:at + 8]
        (length,), (crc_header,) = struct.unpack("<Q", header), struct.unpack("<I", blob[at + 8:at + 12])
        data = blob[at + 12:at + 12 + length]
        (crc_data,) = struct.unpack("<I", blob[at + 12 + length:at + 16 + length])
        assert (crc_header, crc_data) == (masked(header), masked(data)), records
        at, records = at + 16 + length, records + 1
    assert records >= 4  # the file's version record and a point a step


def test_without_google_crc32c_tensorboards_own_checksum_stays(tmp_path, monkeypatch):
    """A machine whose packages lack google-crc32c (a container's own): the run's TensorBoard
    still writes, with TensorBoard's Python checksum."""
    import sys

    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow as stub

    from ddp_lab.folder.tensorboard import TensorBoardRun, checksum_in_c

    monkeypatch.setitem(sys.modules, "google_crc32c", None)  # import fails
    monkeypatch.setattr(stub, "crc32c", python_crc)
    checksum_in_c()
    assert stub.crc32c is python_crc
    run = TensorBoardRun(tmp_path / "tb", "w1")
    run.scalars(1, {"loss/train": 0.5})
    run.close()
    (path,) = (tmp_path / "tb").rglob("events.out.tfevents.*")
    assert path.stat().st_size > 0
