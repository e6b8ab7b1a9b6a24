r"""TensorBoard for one run folder: one writer, so one TensorBoard run per training.

    RUN/tb/<name>/events.out.tfevents.*      e.g. RUN/tb/ring_w4_mlp/

TensorBoard names a run by its folder relative to --logdir, so `<name>` carries what the
sidebar needs to tell trainings apart (`run_name`: sync, world size, model, ...). A
resumed run goes on in the folder its first segment made, whatever its name says.

One x axis, the global step (optimiser steps done over all epochs): a per-step point at
its step, an epoch's scalars at the epoch's last step, and `epoch` as a scalar of its own
(Lightning's layout), so per-step and per-epoch cards line up. A resumed run hides every
point past its checkpoint: one writer, one axis, one purge step.

Tags carry their units in brackets, `time/epoch[s]`, `comm/busbw[GB/s]`: never in
parentheses, which the custom-scalars dashboard cannot draw (it names a line
`<tag> (<run>)` and finds the run again with /\((.*)\)$/, so a tag with "(" gets no
colour and its line stays invisible).

Written once, at step 0 of a fresh run, so they show while it runs: the config as text,
the custom-scalars layout (`LAYOUT`: compute, in-flight and exposed comm on one chart)
and the hparams (`hparams_summaries`). The HParams dashboard ticks its first five
hparams, ordered by the experiment's `differs` flag, then by name; torch's `add_hparams`
sets no flag, so the five were the alphabetical first (backend, batch_size, ...). Here
the keys a study or sweep varies (`VARYING`) carry it, so they are the five ticked.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

EVENTS = "events.out.tfevents.*"
# the writer's own thread writes and flushes the file (every FLUSH_S seconds when there is
# something new): TensorBoard sees a step within seconds and the training thread never
# waits, the queue being long enough for the points of several seconds
FLUSH_S = 2
QUEUE = 1000

VARYING = ("sync", "world_size", "nodes", "compress", "overlap")
METRICS = ("hparam/test_accuracy", "hparam/epoch_time_s", "hparam/comm_fraction",
           "hparam/busbw_GBps")


def _chart(*tags: str) -> list:
    """A multiline chart of these exact tags (the plugin takes regular expressions)."""
    return ["Multiline", [f"^{re.escape(t)}$" for t in tags]]


# Custom scalars: one chart per question, every selected run's lines in it (a study's
# points and repeats side by side: select them with the run filter, e.g. `_w2_`)
LAYOUT = {
    "compute and comm": {
        "per epoch (ms/step): compute, comm in flight, comm exposed": _chart(
            "time/compute[ms/step]", "comm/inflight[ms/step]", "comm/exposed[ms/step]"),
        "per step (ms): compute, comm in flight, comm exposed": _chart(
            "step/compute[ms]", "step/comm[ms]", "step/comm_exposed[ms]"),
        "step time (ms): each step, epoch mean, median, p95": _chart(
            "step/time[ms]", "time/step[ms/step]", "time/step_median[ms]", "time/step_p95[ms]"),
        "bandwidth (GB/s): algbw, busbw": _chart("comm/algbw[GB/s]", "comm/busbw[GB/s]"),
    },
    "training": {
        "loss: train, test": _chart("loss/train", "loss/test"),
        "accuracy: train, test": _chart("accuracy/train[fraction]", "accuracy/test[fraction]"),
    },
}


def run_name(hparams: dict[str, Any], repeat: Optional[int] = None) -> str:
    """The TensorBoard run's folder: `ring_w4_mlp`; with what is not the default,
    `ring-fp16-overlap_w8n2_mlp_r3` (fp16 gradients, overlapped, 8 ranks on 2 nodes,
    repeat 3 of a study point)."""
    sync = hparams["sync"]
    if hparams.get("compress", "none") != "none":
        sync += f"-{hparams['compress']}"
    if hparams.get("overlap") and hparams["sync"] != "ddp":  # ddp always overlaps
        sync += "-overlap"
    world = f"w{hparams['world_size']}" + (f"n{hparams['nodes']}" if hparams.get("nodes", 1) > 1 else "")
    return "_".join([sync, world, hparams["model"], *([f"r{repeat}"] if repeat else [])])


def run_folder(tb_root: Path, name: str) -> Path:
    """The run's writer folder: the one a former segment wrote, else `tb_root/name`."""
    written = _written(tb_root)
    return written[0] if written else tb_root / name


def _written(tb_root: Path) -> list[Path]:
    # tb/steps/ is the per-step writer of the layout before this one: not ours to go on in
    return sorted(p.parent for p in tb_root.glob(f"*/{EVENTS}") if p.parent.name != "steps")


def hparams_summaries(hparams: dict[str, Any]) -> list:
    """The HParams plugin's experiment (hparams in `hparams`' order, `VARYING` flagged
    `differs`; metrics `METRICS`) and this run's session start, as Summary protos."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    infos, start = [], plugin_data_pb2.SessionStartInfo()
    for name, value in hparams.items():
        if isinstance(value, bool):  # before int: a bool is an int
            kind, start.hparams[name].bool_value = api_pb2.DATA_TYPE_BOOL, value
        elif isinstance(value, (int, float)):
            kind, start.hparams[name].number_value = api_pb2.DATA_TYPE_FLOAT64, value
        else:
            kind, start.hparams[name].string_value = api_pb2.DATA_TYPE_STRING, str(value)
        infos.append(api_pb2.HParamInfo(name=name, type=kind, differs=name in VARYING))
    experiment = api_pb2.Experiment(hparam_infos=infos, metric_infos=[
        api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag)) for tag in METRICS])
    return [Summary(value=[Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(data))])
            for tag, data in ((metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment)),
                              (metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=start)))]


class TensorBoardRun:
    """The writer of one run's TensorBoard folder (`run_folder`). `purge_step`: hide the
    points a former segment wrote at this step and after (None: nothing to hide)."""

    def __init__(self, tb_root: Path, name: str, purge_step: Optional[int] = None):
        from torch.utils.tensorboard import SummaryWriter  # lazy: 0.3 s to import

        self.folder = run_folder(tb_root, name)
        self.writer = SummaryWriter(str(self.folder), purge_step=purge_step, max_queue=QUEUE,
                                    flush_secs=FLUSH_S)

    @staticmethod
    def written(tb_root: Path) -> bool:
        """Whether a former segment of the run wrote its TensorBoard folder."""
        return bool(_written(tb_root))

    @staticmethod
    def clear(tb_root: Path) -> None:
        """Remove the event files under `tb_root` and the folders left empty: a fresh
        start keeps no record of a former attempt (TensorBoard's purge would keep its
        step-0 text and layout, which a fresh start writes again)."""
        for f in tb_root.rglob(EVENTS):
            f.unlink()
        for d in sorted((p for p in tb_root.rglob("*") if p.is_dir()), reverse=True):
            if not any(d.iterdir()):
                d.rmdir()

    def head(self, config_text: str, hparams: dict[str, Any]) -> None:
        """A fresh run's first events (step 0): config, layout, hparams."""
        self.writer.add_text("config", config_text, 0)
        self.writer.add_custom_scalars(LAYOUT)
        for summary in hparams_summaries(hparams):
            self.writer.file_writer.add_summary(summary, 0)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """`values` at global step `step`, as one event: the writer checksums every event
        in pure Python (tens of us each), so one per point, not one per tag."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        self.writer.file_writer.add_summary(Summary(value=[
            Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items()]), step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
