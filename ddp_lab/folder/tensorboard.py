r"""TensorBoard for one run folder, `RUN/tb/<name>/`: one writer, one TensorBoard run per training
(docs/timing.md, "TensorBoard", shows what it draws). One x axis, the global step; a resumed run
goes on in its first segment's folder and purges the points past its checkpoint. Tags carry units
in brackets, `time/epoch[s]`, never parentheses: the custom-scalars dashboard finds a line's run
with /\((.*)\)$/. At step 0: the run's head (`write_head`): its config, its charts' layout (its
band charts and its workload's comparison charts, as the custom-scalars layout TensorBoard reads;
docs/timing.md) and its hparams as the HParams dashboard shows them; a resumed run's replaces the
former's.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Optional

from .files import atomic_open

EVENTS = "events.out.tfevents.*"
# the writer's thread flushes every FLUSH_S seconds; the queue holds several seconds' points
FLUSH_S = 2
QUEUE = 1000

# a short run writes per-step points more often than tb_every, to have MIN_POINTS of them
MIN_POINTS = 20


def checksum_in_c() -> None:
    """TensorBoard's writer, without TensorFlow, checksums each record (CRC-32C) in pure Python:
    about 40 us for a 200-byte event, in the writer's thread but holding the GIL the training
    thread needs (docs/performance.md, "A count you pin, and timing on against off").
    google-crc32c computes the same checksum in C in 0.2 us; TensorBoard's record writer and
    reader ask its stub module for `crc32c` by name at each record, so that name is handed the
    C one. Idempotent. Where google-crc32c is missing or has no C build (a container's own
    packages), TensorBoard's checksum stays."""
    try:
        import google_crc32c
    except ImportError:
        return
    if google_crc32c.implementation != "c":
        return
    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow

    pywrap_tensorflow.crc32c = google_crc32c.value


def step_stride(tb_every: int, steps: int) -> int:
    """Every how many steps a run of `steps` steps writes a per-step point (0: none)."""
    return max(1, min(tb_every, steps // MIN_POINTS)) if tb_every > 0 else 0


# the HParams dashboard's metric columns, at every epoch's end: it shows the first five sorted
# tags, and an upper-case group sorts before every lower-case tag
RUN_METRICS = {"test_accuracy": "Run/test_accuracy", "epoch_time_s": "Run/epoch_time_median[s]",
               "comm_fraction": "Run/comm_fraction", "busbw_GBps": "Run/busbw[GB/s]"}


# A run's margin chart: comm in flight as a band ending at compute + exposed, so the part above the
# compute line is exposed; under the run's own tags, `band/<run folder>/...`. (compute, in flight,
# exposed) -> (the chart's line, band from, band to)
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


# What a workload's runs are compared on (`compare`): one tag in every run of the workload,
# `by_epoch/<workload>/...` at x = the epoch (1-based) and `by_step/<workload>/ .../e<epoch>` at x
# = the step within its epoch (a tag per epoch: TensorBoard keeps one line per tag in step order),
# so runs of any length share an axis, and TensorBoard's run name tells the lines apart. (the
# point's scalar, the comparison's name, its chart's title), in the charts' order
BY_EPOCH = (("time/epoch[s]", "time[s]", "time per epoch (s)"),
            ("time/compute[ms/step]", "compute[ms/step]", "compute (ms/step)"),
            ("comm/inflight[ms/step]", "comm_inflight[ms/step]", "comm in flight (ms/step)"),
            ("comm/exposed[ms/step]", "comm_exposed[ms/step]", "exposed comm (ms/step)"),
            ("time/step[ms/step]", "step[ms/step]", "step (ms/step)"),
            ("comm/busbw[GB/s]", "busbw[GB/s]", "busbw (GB/s)"),
            ("accuracy/test[fraction]", "test_accuracy[fraction]", "test accuracy"),
            ("loss/train", "train_loss", "train loss"))
BY_STEP = (("step/compute[ms]", "compute[ms]", "compute (ms)"),
           ("step/comm[ms]", "comm_inflight[ms]", "comm in flight (ms)"),
           ("step/comm_exposed[ms]", "comm_exposed[ms]", "exposed comm (ms)"),
           ("step/time[ms]", "step[ms]", "step time (ms)"))


def workload(hparams: dict[str, Any]) -> tuple[str, str]:
    """What a run trains, as (key, words): `("mlp_mnist_b64", "mlp, mnist, batch 64/rank")`; the
    optimiser, lr, sync, world and length left out, so runs that differ in them share the charts."""
    from .description import Description, safe

    w = Description.from_hparams(hparams).w
    options = list(w.get("model_options") or ())
    model, data = str(w.get("model") or "?"), str(w.get("data") or "mnist")
    gb = w.get("global_batch")
    words = model + (" (" + ", ".join(f"{k}={v}" for k, v in options) + ")" if options else "")
    key = [model, *(f"{k}{v}" for k, v in options), data,
           f"gb{gb}" if gb else f"b{w.get('batch_size')}"]
    text = [words, data, f"global batch {gb}" if gb else f"batch {w.get('batch_size')}/rank"]
    if w.get("micro_batch"):
        key.append(f"mb{w['micro_batch']}")
        text.append(f"micro {w['micro_batch']}")
    return safe("_".join(key)), ", ".join(text)


def compare_tag(load: str, axis: str, name: str, epoch: Optional[int] = None) -> str:
    """`by_epoch/mlp_mnist_b64/time[s]`, `by_step/mlp_mnist_b64/compute[ms]/e2`."""
    return f"{axis}/{load}/{name}" + (f"/e{epoch}" if epoch is not None else "")


def compare(load: str, values: dict[str, float], epoch: int, step_in_epoch: int = 0
            ) -> tuple[int, dict[str, float]]:
    """The comparison point of a point's `values` (an epoch's at its end, or a step's,
    `step_in_epoch` 1-based): its x and its tags (none where it has none)."""
    if step_in_epoch:
        return step_in_epoch, {compare_tag(load, "by_step", name, epoch): values[tag]
                               for tag, name, _ in BY_STEP if tag in values}
    return epoch, {compare_tag(load, "by_epoch", name): values[tag]
                   for tag, name, _ in BY_EPOCH if tag in values}


def run_name(hparams: dict[str, Any], repeat: Optional[int] = None) -> str:
    """The label of the run's description from its hparams (`ring-prepost_w4_mlp`,
    `ring-fp16-overlap_w8n2_mlp_sgd_r3`)."""
    from .description import Description

    return Description.from_hparams(hparams).label(repeat)


def writer_name(label: str, run_folder_name: str, extras: tuple[str, ...] = ()) -> str:
    """The TensorBoard run's folder under `RUN/tb/`. TensorBoard names a run by its path, `<run
    folder>/tb/<this>`, so this holds what the run folder's name does not: `extras` (`20steps`,
    `slow1-30ms`; `full`), and the label where the folder is not named by it."""
    from .description import safe

    tail = list(extras) or ["full"]
    head = [] if run_folder_name.startswith(label) else [label]
    return safe("_".join(head + tail))


def length_extras(max_steps_per_epoch: Optional[int], delay: Optional[dict] = None) -> tuple[str, ...]:
    """What tells two runs of one label apart: the step cap (`20steps`; `full` epochs), an injected
    delay (`slow1-30ms`, `jitter5ms`). The epochs are left out: a resumed run may go on for more."""
    out = [f"{max_steps_per_epoch}steps" if max_steps_per_epoch else "full"]
    if delay:
        if delay.get("slow_rank") is not None:
            out.append(f"slow{delay['slow_rank']}-{delay['slow_ms']:g}ms")
        if delay.get("jitter_ms"):
            out.append(f"jitter{delay['jitter_ms']:g}ms")
    return tuple(out)


def run_folder(tb_root: Path, name: str) -> Path:
    """The run's writer folder: the one a former segment wrote, else `tb_root/name`."""
    return next(iter(written_folders(tb_root)), tb_root / name)


def written_folders(tb_root: Path) -> list[Path]:
    """The writer folders a former segment wrote (tb/steps/ is the per-step writer of the layout
    before this one: not ours to go on in)."""
    return sorted(p.parent for p in tb_root.glob(f"*/{EVENTS}") if p.parent.name != "steps")


class TensorBoardRun:
    """One run's TensorBoard writer; `purge_step`: hide a former segment's points."""

    def __init__(self, tb_root: Path, name: str, purge_step: Optional[int] = None,
                 load: tuple[str, str] = ("?", "?"), steps_per_epoch: int = 0):
        """`load`: the run's `workload` (its comparison charts and tags); `steps_per_epoch`: to
        place a step's point within its epoch (0: no per-step comparison points)."""
        from torch.utils.tensorboard import SummaryWriter  # lazy: 0.3 s to import

        checksum_in_c()
        self.folder = run_folder(tb_root, name)
        # the band's tags and chart: the run folder's name (unique, and first in the sidebar)
        self.band = tb_root.resolve().parent.name
        self.load, self.steps_per_epoch = load, steps_per_epoch
        self.writer = SummaryWriter(str(self.folder), purge_step=purge_step, max_queue=QUEUE,
                                    flush_secs=FLUSH_S)

    @staticmethod
    def clear(tb_root: Path) -> None:
        """Remove the event files under `tb_root` and the folders left empty: a fresh start keeps
        nothing of a former attempt (a purge would keep its step-0 text and layout)."""
        for f in tb_root.rglob(EVENTS):
            f.unlink()
        for d in sorted((p for p in tb_root.rglob("*") if p.is_dir()), reverse=True):
            if not any(d.iterdir()):
                d.rmdir()

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """`values` at global step `step` as one event (each event costs its serialisation); a
        step's point (it has `epoch`) also as its comparison point, at its step within the epoch."""
        self._event(step, with_bands(values, self.band))
        if self.steps_per_epoch and "epoch" in values and "step/time[ms]" in values:
            epoch = int(values["epoch"])
            self._event(*compare(self.load[0], values, epoch,
                                 step - (epoch - 1) * self.steps_per_epoch))

    def epoch(self, epoch: int, values: dict[str, float]) -> None:
        """Epoch `epoch`'s comparison point (x: the epoch) from its scalars."""
        self._event(*compare(self.load[0], values, epoch))

    def _event(self, step: int, values: dict[str, float]) -> None:
        """`values` at `step` as one event; none without values."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        if values:
            self.writer.file_writer.add_summary(Summary(value=[
                Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items()]), step)

    def close(self) -> None:
        self.writer.close()


def _lines(*tags: str) -> dict:
    """A multiline chart of these exact tags (the plugin takes regular expressions)."""
    return {"multiline": {"tag": [f"^{re.escape(t)}$" for t in tags]}}


def compare_categories(load: tuple[str, str]) -> list:
    """The workload's two comparison categories (open): x = epoch, and x = step within epoch."""
    key, words = load
    by_step = [(title, {"multiline": {"tag": [
        "^" + re.escape(compare_tag(key, "by_step", name)) + r"/e\d+$"]}})
        for _, name, title in BY_STEP]
    return [(f"{words}: the runs compared, x = epoch (a line per run)", False,
             [(title, _lines(compare_tag(key, "by_epoch", name))) for _, name, title in BY_EPOCH]),
            (f"{words}: the runs compared per step, x = the step within its epoch "
             "(a line per run and epoch)", False, by_step)]


# One run's margin chart, in a category of its own, closed (`ONE_RUN`: which, title, closed, the
# band's tags, the title's tail)
ONE_RUN = (("step", "one run: compute vs comm per step, a chart per run (line = compute ends, "
                    "band = comm in flight; above the line: exposed)", True,
            ("step/compute[ms]", "step/comm[ms]", "step/comm_exposed[ms]"), "per step (ms)"),
           ("epoch", "one run: compute vs comm per epoch, a chart per run", True,
            ("time/compute[ms/step]", "comm/inflight[ms/step]", "comm/exposed[ms/step]"),
            "per epoch (ms/step)"))


def layout(run: str, bands: tuple[str, ...], load: tuple[str, str]):
    """Run `run`'s custom-scalars layout proto: its workload's comparison charts
    (`compare_categories`), then its band charts (`ONE_RUN`). `bands`: the charts that will draw a
    line; a left-out chart keeps its category, since the plugin merges every run's categories into
    the first run's (a category the first run lacks holds only the charts of the first run that has
    it: the comparison charts are alike in every run of a workload)."""
    from tensorboard.plugins.custom_scalar import layout_pb2

    def band(names: tuple[str, str, str]) -> dict:
        line, low, high = (band_tag(run, n) for n in names)
        return {"margin": {"series": [{"value": line, "lower": low, "upper": high}]}}

    categories = compare_categories(load) + [
        (title, closed, [(f"{run}: {what}", band(BANDS[triple]))] if which in bands else [])
        for which, title, closed, triple, what in ONE_RUN]
    return layout_pb2.Layout(category=[
        layout_pb2.Category(title=title, closed=closed,
                            chart=[layout_pb2.Chart(title=t, **content) for t, content in charts])
        for title, closed, charts in categories])


def layout_summary(run: str, bands: tuple[str, ...], load: tuple[str, str]):
    """Run `run`'s `layout` as the Summary the plugin reads, built as torch's `add_custom_scalars`
    builds it (the plugin's own `summary.pb` imports TensorFlow)."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="custom_scalars"))
    tensor = TensorProto(dtype="DT_STRING", string_val=[layout(run, bands, load).SerializeToString()],
                         tensor_shape=TensorShapeProto())
    return Summary(value=[Summary.Value(tag=LAYOUT_TAG, tensor=tensor, metadata=meta)])


LAYOUT_TAG = "custom_scalars__config__"


def write_head(run: TensorBoardRun, config_text: str, hparams: dict[str, Any],
               bands: tuple[str, ...], fresh: bool) -> None:
    """Run `run`'s head at step 0: config (a fresh run's only), `layout` with its `bands`, hparams.
    A resumed run's replace the former segment's (`drop_head`, before its writer opened)."""
    if fresh:
        run.writer.add_text("config", config_text, 0)
    for summary in [layout_summary(run.band, bands, run.load), *hparams_summaries(hparams)]:
        run.writer.file_writer.add_summary(summary, 0)


# The HParams dashboard sorts the hparams, those that differ among the runs shown first, by name,
# and ticks the first five: the settings keep their names (`sync`, `world_size`, ...;
# `sync.<option>`, `model.<option>`) and every other hparam is named `~<name>` (`~epochs`,
# `~optim`), which sorts after every letter, so a setting that varies is shown.
SETTINGS = ("sync", "world_size", "nodes", "launcher", "model")
LATER = "~"


def hparams_summaries(hparams: dict[str, Any]) -> list:
    """This run's HParams session start, as Summary protos, the settings first (`SETTINGS`); no
    experiment, so the plugin ticks the hparams that differ among the runs shown. Integers as
    strings (else 2 is 2.0000)."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    first = {k: hparams[k] for k in SETTINGS if k in hparams}
    first.update((k, v) for k, v in hparams.items() if k.startswith(("sync.", "model.")))
    shown = {**first, **{f"{LATER}{k}": v for k, v in hparams.items() if k not in first}}
    start = plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
    for name, value in shown.items():
        # before int: a bool is an int
        if isinstance(value, bool):
            start.hparams[name].bool_value = value
        elif isinstance(value, float):
            start.hparams[name].number_value = value
        else:
            start.hparams[name].string_value = str(value)
    data = plugin_data_pb2.HParamsPluginData(session_start_info=start)
    return [Summary(value=[Summary.Value(tag=metadata.SESSION_START_INFO_TAG,
                                         metadata=metadata.create_summary_metadata(data))])]


def drop_head(folder: Path) -> None:
    """Rewrite `folder`'s event files without their layout and hparams events: TensorBoard keeps a
    tag's first metadata, so a resumed run's new ones (`write_head`) show only where the former are
    gone. Each file is replaced whole (atomically)."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.plugins.hparams import metadata
    from tensorboard.summary.writer.record_writer import RecordWriter

    checksum_in_c()
    head = {LAYOUT_TAG, metadata.SESSION_START_INFO_TAG}
    for path in sorted(folder.glob(EVENTS)):
        records = list(RawEventFileLoader(str(path)).Load())  # as written (not migrated)
        kept = [r for r in records if not any(v.tag in head for v in Event.FromString(r).summary.value)]
        if len(kept) == len(records):
            continue
        with atomic_open(path, "wb") as fh:
            writer = RecordWriter(fh)
            for record in kept:
                writer.write(record)
            writer.flush()
