"""Pictures that hold still (ddp_lab/report/plots.py, witness.py):
a synchroniser's colour read from two reports over different folders, titles that fit
their axes and break only between phrases, "after warm-up" only where an epoch was left
out, and each witness disagreement on a line of the terminal.

Three real 2-rank runs (20 steps an epoch), made once: ring profiled for 1 epoch, ddp
profiled for 2, ring with sync.prepost=true for 1; folders beside them written through the
trainer's own types (report_data.py) add syncs and orders no run needs to train for."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import QUICK, run_cli, run_dir_of
from report_data import runbook_folder, train_run
from test_report_plots import legend_clear_of_axes

from ddp_lab.config import SCHEMAS
from ddp_lab.config.registry import Registry
from ddp_lab.report import plots
from ddp_lab.report.build import build_report
from ddp_lab.report.plots import phase_figure
from ddp_lab.report.run import find_runs

PROFILED = ("timing.profile=true", "timing.profile_skip=3", "timing.profile_steps=10")


@pytest.fixture(scope="module")
def real(tmp_path_factory, shared_data_root):
    """name -> run folder: ring (1 epoch, profiled), ddp (2 epochs, profiled), ring
    prepost=true (1 epoch), each 2 ranks of 20 steps an epoch."""
    root = tmp_path_factory.mktemp("style-runs")
    out = {}
    for name, args in (("ring", ("sync=ring", *PROFILED)),
                       ("ddp", ("sync=ddp", "train.epochs=2", *PROFILED)),
                       ("ring_prepost", ("sync=ring", "sync.prepost=true"))):
        proc = run_cli(*QUICK, *args, "launcher.nproc_per_node=2", "train.checkpoint=false",
                       f"data.root={shared_data_root}", f"run.root={root / name}", cwd=root,
                       timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out[name] = run_dir_of(proc)
    return out


def _folder(root: Path, real: dict, names: list[str]) -> Path:
    """A folder holding copies of the real runs `names`, each under a name that sets the
    order find_runs reads them in."""
    root.mkdir(parents=True)
    for i, name in enumerate(names):
        shutil.copytree(real[name], root / f"{i:02d}_{real[name].name}")
    return root


def drawn_colors(doc: dict) -> dict[str, str]:
    """series label -> colour, read from the artists of the figures the report draws from
    its report.json: a bar's face by its name on the axis, a line's by its legend entry, a
    phase bar's name by its frame's colour."""
    from matplotlib.colors import to_hex

    out: dict[str, set] = {}
    fig, info = plots.epoch_time_figure(doc["scaling"])
    labels = {s["label"]: s["sync"] for s in info["data"]}
    for ax in fig.axes:
        ticks = [t.get_text() for t in ax.get_yticklabels()]
        for patch in ax.patches:
            y = round(patch.get_y() + patch.get_height() / 2)
            out.setdefault(labels[ticks[y]], set()).add(to_hex(patch.get_facecolor()))
    for legend in fig.legends:  # a figure of bars alone, each named on its axis, has none
        for handle, text in zip(legend.legend_handles, legend.get_texts()):
            if text.get_text() in labels:
                out.setdefault(labels[text.get_text()], set()).add(to_hex(handle.get_color()))
    fig, info = phase_figure(doc["phases"])
    names = {b["name"]: b["sync"] for b in info["data"]}
    for ax in fig.axes:
        for t in ax.get_yticklabels():
            out.setdefault(names[t.get_text()], set()).add(to_hex(t.get_bbox_patch().get_edgecolor()))
    assert all(len(c) == 1 for c in out.values()), out  # one colour per sync in a report
    return {k: c.pop() for k, c in out.items()}


@pytest.mark.slow  # the module's three real runs (~25 s idle)
@pytest.mark.dist
def test_two_reports_give_each_sync_one_colour(real, tmp_path):
    """Two folders, different syncs in different orders: every sync both hold is drawn in
    one colour in both reports, as the sidecar JSONs say and as the artists show."""
    a = _folder(tmp_path / "a", real, ["ddp", "ring"])
    train_run(a, "tree_fixture", sync="tree", steps=20, epoch_s=(0.4,))
    b = _folder(tmp_path / "b", real, ["ring_prepost", "ring", "ddp"])
    train_run(b, "00_allreduce_fixture", sync="allreduce", steps=20, epoch_s=(0.4,))
    train_run(b, "zz_naive_fixture", sync="naive", steps=20, epoch_s=(0.4,))
    colors = []
    for folder in (a, b):
        res = build_report(find_runs([folder]), folder / "report")
        written = {}
        for f in ("epoch_time_vs_world.json", "phases.json"):
            for sync, c in json.loads((folder / "report" / f).read_text())["colors"].items():
                assert written.setdefault(sync, c) == c, (f, sync)
        assert drawn_colors(res["doc"]) == written
        colors.append(written)
    (ca, cb) = colors
    assert set(ca) == {"ddp", "ring", "tree"}
    assert set(cb) == {"ddp", "ring", "ring prepost=true", "allreduce", "naive"}
    for sync in set(ca) & set(cb):
        assert ca[sync] == cb[sync], sync
    # each sync its own colour; an option setting a shade of its sync's, never the same
    assert len(set(cb.values())) == len(cb)
    assert cb["ring prepost=true"] == plots.sync_color("ring prepost=true") != cb["ring"]


def test_a_new_sync_takes_a_colour_the_others_keep_theirs(monkeypatch):
    """Registered after the others, a synchroniser gets a colour of its own and no other
    colour moves; names outside the registry get one by their name alone."""
    before = {s: plots.name_color(s) for s in SCHEMAS["sync"]}
    assert len(set(before.values())) == len(before)  # every registered sync its own
    registry = Registry("sync", {**dict(SCHEMAS["sync"]), "newsync": object})
    monkeypatch.setitem(SCHEMAS, "sync", registry)
    after = {s: plots.name_color(s) for s in SCHEMAS["sync"]}
    assert {s: after[s] for s in before} == before
    assert after["newsync"] not in before.values()
    # option settings: a shade, whatever the order of the words, the same in every call
    assert plots.sync_color("ring prepost=true overlap=true") == \
        plots.sync_color("ring overlap=true prepost=true") != plots.name_color("ring")
    assert plots.name_color("gone_sync") == plots.name_color("gone_sync") not in before.values()


def _title_fits(fig) -> None:
    """Every axes title and the figure's title: no line wider than its axes (the figure)
    and no phrase of a ', '-joined title split over two lines."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    from matplotlib.text import Text

    for ax in fig.axes:
        title = ax.title
        if not title.get_text():
            continue
        width = ax.get_window_extent(r).width
        for line in title.get_text().split("\n"):
            probe = Text(text=line, fontsize=title.get_fontsize(), figure=fig)
            assert probe.get_window_extent(r).width <= width, (line, width)
        lines = title.get_text().split("\n")
        for a, b in zip(lines, lines[1:]):
            # a break inside a phrase ("2\nepochs") leaves a line ending in a bare number
            assert a.endswith(",") or b.startswith(("time per epoch", "efficiency")), (a, b)
    for text in fig.texts:
        assert text.get_window_extent(r).width <= fig.bbox.width, text.get_text()


def test_titles_fit_and_break_between_phrases(tmp_path):
    """The runbook's folder (five workloads, seven syncs): every title line within its
    axes, broken only after a comma; one bar panel holds the seven syncs of a workload."""
    out = runbook_folder(tmp_path)
    res = build_report(find_runs([out]), tmp_path / "rep")
    fig, info = plots.epoch_time_figure(res["doc"]["scaling"])
    _title_fits(fig)
    capped = [ax for ax in fig.axes if "20 steps/epoch" in ax.get_title()]
    assert len(capped) == 1 and len(capped[0].patches) == 7
    fig, _ = phase_figure(res["doc"]["phases"])
    _title_fits(fig)
    # one workload at two worlds: its whole description in the figure's title, which
    # stays clear of the legend at the top right
    one = tmp_path / "one"
    for n in (1, 2):
        train_run(one, f"ring_w{n}", sync="ring", world=n, steps=20, epoch_s=(0.5, 0.3))
    res = build_report(find_runs([one]), tmp_path / "rep1")
    fig, _ = plots.epoch_time_figure(res["doc"]["scaling"])
    legend_clear_of_axes(fig)
    _title_fits(fig)
    assert "20 steps/epoch" in fig.texts[0].get_text()
    assert plots.fit_title("mlp, adam, batch 64/rank (weak scaling), 20 steps/epoch, 2 epochs", 40) \
        == "mlp, adam, batch 64/rank (weak scaling),\n20 steps/epoch, 2 epochs"


@pytest.mark.slow  # the module's three real runs (~25 s idle)
@pytest.mark.dist
def test_warm_up_said_only_where_an_epoch_was_left_out(real, tmp_path):
    """ring ran 1 epoch, ddp 2: one panel (the workload but its epoch count), ddp's time
    after its warm-up epoch, ring's with it, and the axis and bar say so."""
    folder = _folder(tmp_path / "f", real, ["ring", "ddp"])
    res = build_report(find_runs([folder]), folder / "report")
    fig, info = plots.epoch_time_figure(res["doc"]["scaling"])
    (ax,) = fig.axes
    _title_fits(fig)
    assert ax.get_xlabel() == 'epoch time (s) after warm-up,\nunless marked "warm-up in"'
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert ticks == ["ddp · 2 epochs", "ring · 1 epoch"], ticks
    labels = [t.get_text() for t in ax.texts]
    assert sum("warm-up in" in t for t in labels) == 1
    r = fig.canvas.get_renderer()  # every bar's label inside its axes, none cut at the edge
    right = ax.get_window_extent(r).x1
    assert all(t.get_window_extent(r).x1 <= right for t in ax.texts), labels
    assert next(t for t in labels if "warm-up in" in t).startswith(
        plots.sig(info["data"][1]["epoch_time_s"][0]))
    # a 1-epoch run alone: never "after warm-up"
    one = _folder(tmp_path / "one", real, ["ring"])
    res = build_report(find_runs([one]), one / "report")
    fig, _ = plots.epoch_time_figure(res["doc"]["scaling"])
    assert fig.axes[0].get_xlabel() == "epoch time, warm-up included (s)"
    assert "(every epoch counted: no run had more than one):" in res["summary"]


@pytest.mark.slow  # the module's three real runs (~25 s idle)
@pytest.mark.dist
def test_each_witness_disagreement_is_a_terminal_line(real, tmp_path):
    """The report run as a user runs it, over the two profiled runs and a copy of ddp's
    whose rank 1 trace reads 1/1.48 of ddp_lab's comm: one line per figure outside its
    band on the terminal, the same as report.md lists, the copy's among them."""
    folder = _folder(tmp_path / "w", real, ["ring", "ddp"])
    bad = shutil.copytree(real["ddp"], folder / "zz_disagrees")
    s = json.loads((bad / "summary.json").read_text())
    r1 = next(r for r in s["witnesses"]["ranks"] if r["rank"] == 1)
    r1["profiler"]["comm_per_step_s"] = r1["ddp_lab"]["comm_per_step_s"] / 1.48
    (bad / "summary.json").write_text(json.dumps(s))
    proc = run_cli(str(folder), "-o", str(tmp_path / "rep"), "--no-plots", cwd=tmp_path,
                   module="ddp_lab.report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "rep" / "report.json").read_text())
    outside = [r for r in doc["witnesses"] if r["agrees"] is False]
    screen = proc.stdout.splitlines()
    lines = [ln for ln in screen if "ddp_lab / witness" in ln]
    assert len(lines) == len(outside) >= 1, proc.stdout
    mine = [ln for ln in lines if ln.lstrip().startswith("zz_disagrees: comm in flight")]
    assert len(mine) == 1 and "rank 1 1.48" in mine[0] and mine[0].endswith("outside 0.80-1.20")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert all(f"- outside the expected band: {ln.strip()}" in md for ln in lines)
    assert len(screen) <= 40
