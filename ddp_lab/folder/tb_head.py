"""A run's TensorBoard head at step 0: its config, its charts' layout
(tb_charts.py) and its hparams as the HParams dashboard shows them; a
resumed run's replaces the former's."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .tb_charts import LAYOUT_TAG, layout_summary
from .tensorboard import EVENTS, TensorBoardRun


def write_head(run: TensorBoardRun, config_text: str, hparams: dict[str, Any],
               bands: tuple[str, ...] = ("step", "epoch"), fresh: bool = True) -> None:
    """Run `run`'s head at step 0: config (a fresh run's only), `layout`
    with its `bands`, hparams. A resumed run's replace the former
    segment's (`drop_head`, before its writer opened): its hparams say
    what it is now (its epochs, its world)."""
    file_writer = run.writer.file_writer
    if fresh:
        run.writer.add_text("config", config_text, 0)
    file_writer.add_summary(layout_summary(run.band, bands, run.load), 0)
    for summary in hparams_summaries(hparams):
        file_writer.add_summary(summary, 0)


# The HParams dashboard sorts the hparams, those that differ among the
# runs shown first, by name, and ticks the first five: the settings keep
# their names (`sync`, `world_size`, ...; `sync.<option>`,
# `model.<option>`) and every other hparam is named `~<name>`
# (`~epochs`, `~optim`), which sorts after every letter, so a setting
# that varies is shown.
SETTINGS = ("sync", "world_size", "nodes", "launcher", "model")
LATER = "~"


def shown_hparams(hparams: dict[str, Any]) -> dict[str, Any]:
    """`hparams` as HParams shows them: the settings first and by their
    names, the rest `~`-named (`SETTINGS`)."""
    first = {k: hparams[k] for k in SETTINGS if k in hparams}
    first.update((k, v) for k, v in hparams.items() if k.startswith(("sync.", "model.")))
    return {**first, **{f"{LATER}{k}": v for k, v in hparams.items() if k not in first}}


def hparams_summaries(hparams: dict[str, Any]) -> list:
    """This run's HParams session start, as Summary protos; no
    experiment, so the plugin ticks the hparams that differ among the
    runs shown. Integers as strings (else 2 is 2.0000)."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    start = plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
    for name, value in shown_hparams(hparams).items():
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
    """Rewrite `folder`'s event files without their layout and hparams
    events: TensorBoard keeps a tag's first metadata, so a resumed run's
    new ones (`write_head`) show only where the former are gone. Each
    file is replaced whole (atomically)."""
    import os

    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.plugins.hparams import metadata
    from tensorboard.summary.writer.record_writer import RecordWriter

    head = {LAYOUT_TAG, metadata.SESSION_START_INFO_TAG}
    for path in sorted(folder.glob(EVENTS)):
        # as written (not migrated)
        records = list(RawEventFileLoader(str(path)).Load())
        kept = [r for r in records if not any(v.tag in head for v in Event.FromString(r).summary.value)]
        if len(kept) == len(records):
            continue
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as fh:
            writer = RecordWriter(fh)
            for record in kept:
                writer.write(record)
            writer.flush()
        os.replace(tmp, path)
