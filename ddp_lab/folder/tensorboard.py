r"""TensorBoard for one run folder, `RUN/tb/<name>/`: one writer, one TensorBoard run per
training (docs/timing.md, "TensorBoard", shows what it draws). One x axis, the global
step; a resumed run goes on in its first segment's folder and purges the points past its
checkpoint. Tags carry units in brackets, `time/epoch[s]`, never parentheses: the
custom-scalars dashboard finds a line's run with /\((.*)\)$/. At step 0 of a fresh run:
the config, the custom-scalars layout (`layout`) and the hparams (`hparams_summaries`).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Optional


EVENTS = "events.out.tfevents.*"
# the writer's thread flushes every FLUSH_S seconds; the queue holds several seconds' points
FLUSH_S = 2
QUEUE = 1000

# a short run writes per-step points more often than tb_every, to have MIN_POINTS of them
MIN_POINTS = 20


def step_stride(tb_every: int, steps: int) -> int:
    """Every how many steps a run of `steps` steps writes a per-step point (0: none)."""
    return max(1, min(tb_every, steps // MIN_POINTS)) if tb_every > 0 else 0


# the HParams dashboard's metric columns, at every epoch's end: it shows the first five
# sorted tags, and an upper-case group sorts before every lower-case tag
RUN_METRICS = {"test_accuracy": "Run/test_accuracy", "epoch_time_s": "Run/epoch_time_median[s]",
               "comm_fraction": "Run/comm_fraction", "busbw_GBps": "Run/busbw[GB/s]"}


def run_metrics(**figures: float) -> dict[str, float]:
    """`RUN_METRICS`' scalars from the run's figures so far (test_accuracy=..., ...)."""
    return {RUN_METRICS[name]: value for name, value in figures.items()}


# A run's margin chart: comm in flight as a band ending at compute + exposed, so the part
# above the compute line is exposed; under the run's own tags, `band/<run folder>/...`.
# (compute, in flight, exposed) -> (the chart's line, band from, band to)
BANDS = {("time/compute[ms/step]", "comm/inflight[ms/step]", "comm/exposed[ms/step]"):
         ("epoch_compute[ms/step]", "epoch_comm_from[ms/step]", "epoch_comm_to[ms/step]"),
         ("step/compute[ms]", "step/comm[ms]", "step/comm_exposed[ms]"):
         ("step_compute[ms]", "step_comm_from[ms]", "step_comm_to[ms]")}
BAND = "band"  # the group of the per-run band tags


def band_tag(run: str, name: str) -> str:
    """The tag of run `run`'s band series `name` (a name in `BANDS`' values)."""
    return f"{BAND}/{run}/{name}"


def with_bands(values: dict[str, float], run: str) -> dict[str, float]:
    """`values` and, where it has a (compute, in flight, exposed) triple, run `run`'s band."""
    out = dict(values)
    for (compute, inflight, exposed), names in BANDS.items():
        if compute in values and inflight in values and exposed in values:
            end = values[compute] + values[exposed]
            line, low, high = (band_tag(run, n) for n in names)
            out[line], out[low], out[high] = values[compute], max(0.0, end - values[inflight]), end
    return out


def _lines(*tags: str) -> dict:
    """A multiline chart of these exact tags (the plugin takes regular expressions)."""
    return {"multiline": {"tag": [f"^{re.escape(t)}$" for t in tags]}}


def _band(run: str, names: tuple[str, str, str]) -> dict:
    line, low, high = (band_tag(run, n) for n in names)
    return {"margin": {"series": [{"value": line, "lower": low, "upper": high}]}}


# Custom scalars: a chart per quantity to compare runs (`LAYOUT`), and per run its margin
# chart (`ONE_RUN`: which, title, closed, the band's tags, the title's tail)
ONE_RUN = (("step", "compute vs comm per step, a chart per run: line = compute ends, band = "
                    "comm in flight (above the line: exposed)", False,
            ("step/compute[ms]", "step/comm[ms]", "step/comm_exposed[ms]"), "per step (ms)"),
           ("epoch", "compute vs comm per epoch, a chart per run", True,
            ("time/compute[ms/step]", "comm/inflight[ms/step]", "comm/exposed[ms/step]"),
            "per epoch (ms/step)"))
LAYOUT = (
    ("compute vs comm, runs side by side: one chart per quantity, a colour per run", False, [
        ("compute (ms/step)", _lines("time/compute[ms/step]")),
        ("comm in flight (ms/step)", _lines("comm/inflight[ms/step]")),
        ("exposed comm (ms/step)", _lines("comm/exposed[ms/step]")),
        ("step (ms/step)", _lines("time/step[ms/step]")),
    ]),
    ("compute vs comm per step, runs side by side", True, [
        ("compute (ms)", _lines("step/compute[ms]")),
        ("comm in flight (ms)", _lines("step/comm[ms]")),
        ("exposed comm (ms)", _lines("step/comm_exposed[ms]")),
        ("step time (ms): each step, epoch mean, median, p95", _lines(
            "step/time[ms]", "time/step[ms/step]", "time/step_median[ms]", "time/step_p95[ms]")),
    ]),
    ("bandwidth and training", False, [
        ("busbw (GB/s)", _lines("comm/busbw[GB/s]")),
        ("test accuracy", _lines("accuracy/test[fraction]")),
        ("loss: train, test", _lines("loss/train", "loss/test")),
    ]),
)


def layout(run: str, bands: tuple[str, ...] = ("step", "epoch")):
    """Run `run`'s custom-scalars layout proto: its band charts (`ONE_RUN`), then `LAYOUT`.
    `bands`: the charts that will draw a line; a left-out chart keeps its category, since
    the plugin merges every run's categories by the first run's."""
    from tensorboard.plugins.custom_scalar import layout_pb2

    categories = [(title, closed, [(f"{run}: {what}", _band(run, BANDS[triple]))]
                   if which in bands else [])
                  for which, title, closed, triple, what in ONE_RUN] + list(LAYOUT)
    return layout_pb2.Layout(category=[
        layout_pb2.Category(title=title, closed=closed,
                            chart=[layout_pb2.Chart(title=t, **content) for t, content in charts])
        for title, closed, charts in categories])


def layout_summary(run: str, bands: tuple[str, ...] = ("step", "epoch")):
    """Run `run`'s `layout` as the Summary the plugin reads, built as torch's
    `add_custom_scalars` builds it (the plugin's own `summary.pb` imports TensorFlow)."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="custom_scalars"))
    tensor = TensorProto(dtype="DT_STRING", string_val=[layout(run, bands).SerializeToString()],
                         tensor_shape=TensorShapeProto())
    return Summary(value=[Summary.Value(tag="custom_scalars__config__", tensor=tensor, metadata=meta)])


def run_name(hparams: dict[str, Any], repeat: Optional[int] = None) -> str:
    """The TensorBoard run's folder: the label of the run's description from its hparams
    (`ring-prepost_w4_mlp`, `ring-fp16-overlap_w8n2_mlp_sgd_r3`)."""
    from .description import Description

    return Description.from_hparams(hparams).label(repeat)


def run_folder(tb_root: Path, name: str) -> Path:
    """The run's writer folder: the one a former segment wrote, else `tb_root/name`."""
    written = _written(tb_root)
    return written[0] if written else tb_root / name


def _written(tb_root: Path) -> list[Path]:
    # tb/steps/ is the per-step writer of the layout before this one: not ours to go on in
    return sorted(p.parent for p in tb_root.glob(f"*/{EVENTS}") if p.parent.name != "steps")


def hparams_summaries(hparams: dict[str, Any]) -> list:
    """This run's HParams session start, as Summary protos; no experiment, so the plugin ticks
    the hparams that differ among the runs shown. Integers as strings (else 2 is 2.0000)."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    start = plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
    for name, value in hparams.items():
        if isinstance(value, bool):  # before int: a bool is an int
            start.hparams[name].bool_value = value
        elif isinstance(value, float):
            start.hparams[name].number_value = value
        else:
            start.hparams[name].string_value = str(value)
    data = plugin_data_pb2.HParamsPluginData(session_start_info=start)
    return [Summary(value=[Summary.Value(tag=metadata.SESSION_START_INFO_TAG,
                                         metadata=metadata.create_summary_metadata(data))])]


class TensorBoardRun:
    """One run's TensorBoard writer; `purge_step`: hide a former segment's points."""

    def __init__(self, tb_root: Path, name: str, purge_step: Optional[int] = None):
        from torch.utils.tensorboard import SummaryWriter  # lazy: 0.3 s to import

        self.folder = run_folder(tb_root, name)
        # the band's tags and chart: the run folder's name (unique, and first in the sidebar)
        self.band = tb_root.resolve().parent.name
        self.writer = SummaryWriter(str(self.folder), purge_step=purge_step, max_queue=QUEUE,
                                    flush_secs=FLUSH_S)

    @staticmethod
    def written(tb_root: Path) -> bool:
        """Whether a former segment of the run wrote its TensorBoard folder."""
        return bool(_written(tb_root))

    @staticmethod
    def clear(tb_root: Path) -> None:
        """Remove the event files under `tb_root` and the folders left empty: a fresh start keeps
        nothing of a former attempt (a purge would keep its step-0 text and layout)."""
        for f in tb_root.rglob(EVENTS):
            f.unlink()
        for d in sorted((p for p in tb_root.rglob("*") if p.is_dir()), reverse=True):
            if not any(d.iterdir()):
                d.rmdir()

    def head(self, config_text: str, hparams: dict[str, Any],
             bands: tuple[str, ...] = ("step", "epoch")) -> None:
        """A fresh run's first events (step 0): config, `layout` with its `bands`, hparams."""
        self.writer.add_text("config", config_text, 0)
        self.writer.file_writer.add_summary(layout_summary(self.band, bands), 0)
        for summary in hparams_summaries(hparams):
            self.writer.file_writer.add_summary(summary, 0)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """`values` at global step `step` as one event (each event costs a checksum in Python)."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        self.writer.file_writer.add_summary(Summary(value=[
            Summary.Value(tag=tag, simple_value=float(v))
            for tag, v in with_bands(values, self.band).items()]), step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
