"""The report's figures as a person sees them, read through matplotlib's own artists: a
legend outside every axes, one row of panels per workload, error bars and axes that stay
above zero, n on every point, a study's repeats as one labelled bar; and, drawn from
varied folders (seven syncs, capped and full epochs, one world or several, benches of
several implementations, several benches), no two texts overlapping, no legend entry
twice, every implementation drawn, one axis per shared quantity, no empty panel."""

from __future__ import annotations

import itertools
import math

import pytest
from report_data import SYNCS, bench_run, runbook_folder, train_run  # tests/ is on sys.path
from test_report_stats import write_run

from ddp_lab.report import plots
from ddp_lab.report.build import build_report
from ddp_lab.report.plots import bench_figure, phase_figure
from ddp_lab.report.run import find_runs


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Two workloads (20 and 50 steps per epoch): ring at 1, 2, 4 ranks with 3 repeats
    (world 4 spread so wide that a t-interval on the times would reach -2 s), ddp at 1, 2
    with 2 repeats; ring at 1, 2 once each on the other workload."""
    root = tmp_path_factory.mktemp("plots")

    def run(name, n, t, **kw):
        ph = {"data": 0.1, "forward": 0.4, "backward": 0.6 * n, "sync": 0.2 * n, "optim": 0.3}
        write_run(root / "runs", name, n, [9.0, t, t], phase_ms={**ph, "step": sum(ph.values())}, **kw)

    for k, spread in enumerate((1.0, 1.0, 20.0)):
        for n, t in ((1, 1.0), (2, 0.6), (4, 0.1 * spread)):
            run(f"ring_w{n}_r{k}", n, t)
    for k in range(2):
        for n, t in ((1, 1.0 + 0.1 * k), (2, 0.7 + 0.1 * k)):
            run(f"ddp_w{n}_r{k}", n, t, sync="ddp")
    for n, t in ((1, 2.0), (2, 1.5)):
        run(f"long_w{n}", n, t, steps=50)
    res = build_report(find_runs([root / "runs"]), root / "rep", make_plots=True)
    return root / "rep", res


def legend_clear_of_axes(fig) -> None:
    """Every figure legend lies outside every axes (its labels and ticks included) and
    clear of the figure's title."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    assert fig.legends
    for leg in fig.legends:
        box = leg.get_window_extent(r)
        for ax in fig.axes:
            assert not box.overlaps(ax.get_tightbbox(r)), (ax.get_title(), box, ax.get_tightbbox(r))
        for text in fig.texts:  # a suptitle
            assert not box.overlaps(text.get_window_extent(r)), text.get_text()


def test_epoch_time_figure_reads_at_a_glance(report):
    from matplotlib.container import ErrorbarContainer

    rep, res = report
    groups = res["doc"]["scaling"]
    fig, info = plots.epoch_time_figure(groups)
    legend_clear_of_axes(fig)
    # one row (time, efficiency) per workload: capped 20 and 50 steps never share an axis
    assert len(fig.axes) == 4
    titles = [ax.get_title() for ax in fig.axes]
    assert sum("20 steps/epoch\ntime per epoch" in t for t in titles) == 1
    assert sum("50 steps/epoch\ntime per epoch" in t for t in titles) == 1
    bars = 0
    for ax in fig.axes:
        assert ax.get_ylim()[0] >= 0, ax.get_title()
        for c in ax.containers:
            if isinstance(c, ErrorbarContainer):
                for seg in (s for lc in c.lines[2] for s in lc.get_segments()):
                    assert seg[:, 1].min() >= 0, (ax.get_title(), seg)
                    bars += 1
    assert bars >= 3  # ring's 3-repeat points have bars (the wide one included)
    # every point's n: the panel's common one in its title, any other written at its point
    for ax in fig.axes:
        marked = sorted(t.get_text() for t in ax.texts)
        if "20 steps" in ax.get_title():  # ring n=3 at 1, 2, 4; ddp n=2 at 1, 2
            assert ax.get_title().endswith(", n=3 unless marked") and marked == ["n=2", "n=2"]
        else:
            assert ax.get_title().endswith(", n=1 at every point") and marked == []
    ring20 = next(s for s in info["data"] if s["label"] == "ring" and "20 steps" in s["workload"])
    assert ring20["n"] == [3, 3, 3] and ring20["epoch_time_s_ci95"][2][0] > 0
    # fewer than 3 repeats: no bar, a plain word in the legend instead
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:2] == ["ddp", "ring"] and "ideal scaling" in legend
    assert any("n=1 or 2: interval" in t and "not meaningful" in t for t in legend), legend
    assert all(len(t) <= 30 for t in legend[:2])  # short labels: the workload is the panel's title


def test_phase_figure_groups_repeats_into_one_labelled_bar(report):
    rep, res = report
    fig, info = phase_figure(res["doc"]["phases"])
    legend_clear_of_axes(fig)
    readable(fig)
    # 5 points (ring 1, 2, 4 and ddp 1, 2), one bar each, in one panel: a time per step is
    # compared across step caps, so ring's 50-step runs are repeats of its 20-step ones
    assert len(info["bars"]) == 5 and sum(len(ax.patches) for ax in fig.axes) == 5 * 5
    assert sorted(len(b["runs"]) for b in info["data"]) == [2, 2, 3, 4, 4]
    assert "2 ranks\n4 runs" in info["bars"] and "1 rank\n2 runs" in info["bars"]
    names = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels()]
    assert "ring · 2 ranks · 4 runs" in names and "ddp · 1 rank · 2 runs" in names
    assert len(fig.axes) == 1 and "steps/epoch" not in fig.axes[0].get_title()


def test_report_writes_the_figures(report):
    rep, res = report
    assert [f["file"] for f in res["figures"]] == ["epoch_time_vs_world.png", "phases.png"]
    for f in res["figures"]:
        assert (rep / f["file"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------- any data: read through the artists
def _texts(fig) -> list:
    """Every text a person reads on the figure: titles, axis labels, tick labels within
    their axis, annotations and bar labels, legend entries, the figure's title."""
    from matplotlib.text import Text

    r = fig.canvas.get_renderer()
    out = []
    for ax in (a for ax in fig.axes for a in (ax, *ax.child_axes)):  # a secondary axis too
        box = ax.get_window_extent(r)
        for axis, lo, hi in ((ax.xaxis, box.x0, box.x1), (ax.yaxis, box.y0, box.y1)):
            for t in axis.get_ticklabels():  # a tick outside the view is not drawn
                e = t.get_window_extent(r)
                mid = (e.x0 + e.x1) / 2 if axis is ax.xaxis else (e.y0 + e.y1) / 2
                if t.get_visible() and lo - 1 <= mid <= hi + 1:
                    out.append(t)
            out += [axis.label, axis.get_offset_text()]
        out += [ax.title, *ax.texts]  # ax.texts: annotations and bar labels
    for leg in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]:
        out += [*leg.get_texts(), leg.get_title()]
    out += fig.texts  # the suptitle is one of them
    return [t for t in out if isinstance(t, Text) and t.get_visible() and t.get_text().strip()]


def readable(fig) -> None:
    """No two texts overlap (by more than a pixel each way), no legend says a label twice,
    every panel shows data, no interval reaches below zero."""
    from matplotlib.container import ErrorbarContainer

    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(r)) for t in _texts(fig)]
    for (a, ba), (b, bb) in itertools.combinations(boxes, 2):
        w = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
        h = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
        assert w <= 1 or h <= 1, f"{a!r} overlaps {b!r}"
    for leg in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]:
        labels = [t.get_text() for t in leg.get_texts()]
        assert len(labels) == len(set(labels)), labels
    for ax in fig.axes:
        # data widen the axes' data limits both ways; a reference line (axhline) alone
        # spans x in axes coordinates and leaves them null
        lim = ax.dataLim
        assert math.isfinite(lim.width) and math.isfinite(lim.height), f"empty panel: {ax.get_title()!r}"
        for c in ax.containers:
            if isinstance(c, ErrorbarContainer):
                for seg in (s for lc in c.lines[2] for s in lc.get_segments()):
                    assert seg.min() >= 0, (ax.get_title(), seg)


@pytest.fixture(scope="module")
def runbook(tmp_path_factory):
    """The runbook's outputs/ (report_data.runbook_folder): 21 trainings, 2 benches."""
    root = tmp_path_factory.mktemp("runbook")
    out = runbook_folder(root)
    res = build_report(find_runs([out]), root / "rep", make_plots=False)
    return out, res["doc"], res


def _fits(res):
    from ddp_lab.report import tables

    runs = find_runs([res]) if not isinstance(res, list) else res
    return tables.bench_fits(runs)


def test_one_world_draws_bars_not_empty_panels(tmp_path):
    """Seven syncs on 20-step epochs and two full runs, all at 2 ranks (the issue's
    picture): a bar per sync under each workload, no efficiency panel, no seven points
    stacked at one x; the phase bars' names all readable."""
    for i, s in enumerate(SYNCS):
        train_run(tmp_path / "o", f"capped_{s}", sync=s, steps=20, epoch_s=(0.3, 0.05 + 0.01 * i))
    for s in ("ddp", "ring"):
        train_run(tmp_path / "o", f"full_{s}", sync=s)
    doc = build_report(find_runs([tmp_path / "o"]), tmp_path / "rep", make_plots=False)["doc"]
    fig, info = plots.epoch_time_figure(doc["scaling"])
    readable(fig)
    assert len(fig.axes) == 2  # one panel per workload, no empty efficiency beside it
    capped = next(ax for ax in fig.axes if "20 steps" in ax.get_title())
    assert [t.get_text() for t in capped.get_yticklabels()] == sorted(SYNCS)
    assert len(capped.patches) == 7 and "at 2 ranks (1x2)" in capped.get_title()
    assert not fig.legends  # every bar is named on its axis: nothing to explain
    fig, info = phase_figure(doc["phases"])
    readable(fig)
    legend_clear_of_axes(fig)
    # one panel: the full runs' steps are the capped ones' (a step's time whatever the cap)
    assert len(info["bars"]) == 7 and len(fig.axes) == 1
    bars_read_on_their_own_scale(fig)


def bars_read_on_their_own_scale(fig) -> None:
    """Every panel of the phase figure on an x axis of its own, from zero, that its
    longest bar fills for the most part: no workload's bars a sliver beside another's."""
    for a, b in itertools.combinations(fig.axes, 2):
        assert not a.get_shared_x_axes().joined(a, b), (a.get_title(), b.get_title())
    for ax in fig.axes:
        longest = max(bar.get_x() + bar.get_width() for bar in ax.patches)
        low, high = ax.get_xlim()
        assert low == 0 and longest >= 0.6 * high, (ax.get_title(), longest, high)
        assert ax.get_xticklabels() and ax.get_xlabel(), ax.get_title()  # its scale is shown


def test_phases_of_a_fast_and_a_slow_workload_each_read(tmp_path):
    """mlp at ~4 ms a step and mlp_wide at ~430 ms, with different epoch counts: each
    workload's bars fill their own panel (on one axis the mlp bars were slivers of 1%),
    the legend clear of every panel."""
    for s in ("ddp", "ring"):
        train_run(tmp_path / "o", f"mlp_{s}", sync=s, epoch_s=(2.2, 2.0, 2.0, 2.0, 2.0))
        train_run(tmp_path / "o", f"wide_{s}", sync=s, model="mlp_wide", epoch_s=(210.0, 200.0))
    doc = build_report(find_runs([tmp_path / "o"]), tmp_path / "rep", make_plots=False)["doc"]
    fig, info = phase_figure(doc["phases"])
    readable(fig)
    legend_clear_of_axes(fig)
    assert len(fig.axes) >= 2 and {b["workload"].split(",")[0] for b in info["data"]} >= {"mlp", "mlp_wide"}
    bars_read_on_their_own_scale(fig)


def test_several_worlds_and_one_world_in_one_figure(tmp_path):
    """A workload at 1, 2, 4 ranks (lines and efficiency) beside one at 2 ranks only (bars)."""
    for n, t in ((1, 2.0), (2, 1.2), (4, 0.8)):
        for s in ("ddp", "ring", "tree"):
            for k in range(3):
                train_run(tmp_path / "o", f"{s}_w{n}_r{k}", sync=s, world=n, steps=20,
                          epoch_s=(3.0, t * (1 + 0.05 * k), t))
    for s in SYNCS:
        train_run(tmp_path / "o", f"full_{s}", sync=s)
    doc = build_report(find_runs([tmp_path / "o"]), tmp_path / "rep", make_plots=False)["doc"]
    fig, info = plots.epoch_time_figure(doc["scaling"])
    readable(fig)
    legend_clear_of_axes(fig)
    titles = [ax.get_title() for ax in fig.axes]
    assert sum("efficiency" in t for t in titles) == 1 and len(fig.axes) == 3, titles
    line_t = next(ax for ax in fig.axes if "20 steps" in ax.get_title() and "time" in ax.get_title())
    line_e = next(ax for ax in fig.axes if "efficiency" in ax.get_title())
    assert line_t.get_shared_x_axes().joined(line_t, line_e)  # world size: one axis
    assert all(ax.get_ylim()[0] >= 0 for ax in fig.axes)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"ddp", "ring", "tree", "ideal scaling"} <= set(legend)
    fig, _ = phase_figure(doc["phases"])
    readable(fig)


def test_two_benches_draw_every_implementation(runbook):
    """The default bench and bench.impl=[torch,ring,butterfly,tree,linear]: six lines on
    each panel (torch twice, once per bench, told apart), both panels against bytes."""
    out, doc, res = runbook
    fig, info = bench_figure(_fits(out))
    readable(fig)
    legend_clear_of_axes(fig)
    ax_bw, ax_t = fig.axes
    labels = [ln.get_label() for ln in ax_bw.lines]
    for impl in ("torch", "ring", "butterfly", "tree", "linear"):
        assert any(f" · {impl} (n=2)" in lb for lb in labels), (impl, labels)
    assert len(labels) == 6 and len(set(labels)) == 6
    assert ax_bw.get_xlabel() == ax_t.get_xlabel() == "bytes per rank (log scale)"
    assert ax_bw.get_shared_x_axes().joined(ax_bw, ax_t)
    # every point of the data is on the time panel: bench rows -> lines, fits pale under them
    assert len([ln for ln in ax_t.lines if ln.get_lw() < 3]) == 6
    assert "2 ranks = 1 node x 2 ranks, gloo on CPU" in fig.get_suptitle()


def test_benches_of_several_allocations_and_groups(tmp_path):
    """Three benches: 2 ranks, 4 ranks on 2 nodes (global, intra_node, cross_node) with two
    implementations, and 2 ranks again: one line per bench, implementation and group."""
    bench_run(tmp_path / "o", "b2", impls=("torch", "ring"))
    bench_run(tmp_path / "o", "b4", impls=("torch", "ring"), world=4, nodes=2,
              groups=("global", "intra_node", "cross_node"))
    bench_run(tmp_path / "o", "b2_again", impls=("torch",), alpha_s=5e-4)
    fig, info = bench_figure(_fits(tmp_path / "o"))
    readable(fig)
    legend_clear_of_axes(fig)
    labels = [ln.get_label() for ln in fig.axes[0].lines]
    assert len(labels) == 2 + 6 + 1 == len(set(labels)), labels
    assert sum("cross_node" in lb for lb in labels) == 2


def test_bench_own_plots_read_apart(tmp_path):
    """A bench run's own plots/: five implementations (one figure) and the legend under the
    panels, never over a line."""
    from ddp_lab.bench.output import op_figure

    from report_data import _bench_row

    rows = [_bench_row(i, "global", 2, 2 ** k, 3e-4, 2e-9)
            for i in ("torch", "ring", "butterfly", "tree", "linear") for k in range(10, 21, 2)]
    fig, info = op_figure("all_reduce — 2 ranks", rows, "busbw", 1)
    readable(fig)
    legend_clear_of_axes(fig)
    assert len({ln.get_color() for ln in fig.axes[0].lines}) == 5 == len(info["series"])
    assert fig.axes[0].get_shared_x_axes().joined(*fig.axes)
