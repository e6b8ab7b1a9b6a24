"""The report's figures as a person sees them, read through matplotlib's own artists: a
legend outside every axes, one row of panels per workload, error bars and axes that stay
above zero, n on every point, a study's repeats as one labelled bar."""

from __future__ import annotations

import pytest
from test_report_stats import write_run  # conftest.py puts tests/ on sys.path

from ddp_lab.report import plots
from ddp_lab.report.build import build_report
from ddp_lab.report.runs import find_runs


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
    fig, info = plots.phase_figure(res["doc"]["phases"])
    legend_clear_of_axes(fig)
    # 7 points (ring 1, 2, 4 and ddp 1, 2 on one workload; ring 1, 2 on the other), one bar each
    assert len(info["bars"]) == 7 and len(fig.axes[0].patches) == 7 * 5
    assert sorted(len(b["runs"]) for b in info["data"]) == [1, 1, 2, 2, 3, 3, 3]
    assert "2 ranks\n3 runs" in info["bars"] and "1 rank\n2 runs" in info["bars"]
    (sec,) = fig.axes[0].child_axes
    names = [t.get_text().strip() for t in sec.get_xticklabels()]
    assert len(names) == 3 and sum(n.startswith("ring\n") for n in names) == 2


def test_report_writes_the_figures(report):
    rep, res = report
    assert [f["file"] for f in res["figures"]] == ["epoch_time_vs_world.png", "phases.png"]
    for f in res["figures"]:
        assert (rep / f["file"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
