"""A run's TensorBoard charts: its band charts and its workload's
comparison charts, as the custom-scalars layout TensorBoard reads at
step 0 (docs/timing.md)."""

from __future__ import annotations

import re

from .tensorboard import BANDS, band_tag, compare_tag


def _lines(*tags: str) -> dict:
    """A multiline chart of these exact tags (the plugin takes regular
    expressions)."""
    return {"multiline": {"tag": [f"^{re.escape(t)}$" for t in tags]}}


def _band(run: str, names: tuple[str, str, str]) -> dict:
    line, low, high = (band_tag(run, n) for n in names)
    return {"margin": {"series": [{"value": line, "lower": low, "upper": high}]}}


EPOCH_CHARTS = (("time per epoch (s)", "time[s]"), ("compute (ms/step)", "compute[ms/step]"),
                ("comm in flight (ms/step)", "comm_inflight[ms/step]"),
                ("exposed comm (ms/step)", "comm_exposed[ms/step]"),
                ("step (ms/step)", "step[ms/step]"), ("busbw (GB/s)", "busbw[GB/s]"),
                ("test accuracy", "test_accuracy[fraction]"), ("train loss", "train_loss"))
STEP_CHARTS = (("compute (ms)", "compute[ms]"), ("comm in flight (ms)", "comm_inflight[ms]"),
               ("exposed comm (ms)", "comm_exposed[ms]"), ("step time (ms)", "step[ms]"))


def compare_categories(load: tuple[str, str]) -> list:
    """The workload's two comparison categories (open): every run a
    line, at x = epoch; and per step, at x = the step within its epoch
    (a line per run and epoch)."""
    key, words = load
    by_step = [(title, {"multiline": {"tag": [
        "^" + re.escape(compare_tag(key, "by_step", name)) + r"/e\d+$"]}})
        for title, name in STEP_CHARTS]
    return [(f"{words}: the runs compared, x = epoch (a line per run)", False,
             [(title, _lines(compare_tag(key, "by_epoch", name))) for title, name in EPOCH_CHARTS]),
            (f"{words}: the runs compared per step, x = the step within its epoch "
             "(a line per run and epoch)", False, by_step)]


# One run's margin chart, in a category of its own, closed (`ONE_RUN`:
# which, title, closed, the band's tags, the title's tail)
ONE_RUN = (("step", "one run: compute vs comm per step, a chart per run (line = compute ends, "
                    "band = comm in flight; above the line: exposed)", True,
            ("step/compute[ms]", "step/comm[ms]", "step/comm_exposed[ms]"), "per step (ms)"),
           ("epoch", "one run: compute vs comm per epoch, a chart per run", True,
            ("time/compute[ms/step]", "comm/inflight[ms/step]", "comm/exposed[ms/step]"),
            "per epoch (ms/step)"))


def layout(run: str, bands: tuple[str, ...] = ("step", "epoch"),
           load: tuple[str, str] = ("?", "?")):
    """Run `run`'s custom-scalars layout proto: its workload's
    comparison charts (`compare_categories`), then its band charts
    (`ONE_RUN`). `bands`: the charts that will draw a line; a left-out
    chart keeps its category, since the plugin merges every run's
    categories into the first run's (a category the first run lacks
    holds only the charts of the first run that has it: the comparison
    charts are alike in every run of a workload)."""
    from tensorboard.plugins.custom_scalar import layout_pb2

    categories = compare_categories(load) + [
        (title, closed, [(f"{run}: {what}", _band(run, BANDS[triple]))] if which in bands else [])
        for which, title, closed, triple, what in ONE_RUN]
    return layout_pb2.Layout(category=[
        layout_pb2.Category(title=title, closed=closed,
                            chart=[layout_pb2.Chart(title=t, **content) for t, content in charts])
        for title, closed, charts in categories])


def layout_summary(run: str, bands: tuple[str, ...] = ("step", "epoch"),
                   load: tuple[str, str] = ("?", "?")):
    """Run `run`'s `layout` as the Summary the plugin reads, built as
    torch's `add_custom_scalars` builds it (the plugin's own
    `summary.pb` imports TensorFlow)."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="custom_scalars"))
    tensor = TensorProto(dtype="DT_STRING", string_val=[layout(run, bands, load).SerializeToString()],
                         tensor_shape=TensorShapeProto())
    return Summary(value=[Summary.Value(tag=LAYOUT_TAG, tensor=tensor, metadata=meta)])


LAYOUT_TAG = "custom_scalars__config__"
