"""One description of a run, and the consumers that must not stumble over a run:
settings that differ are two series, the cost model answers every call the code makes
(with its padding), a report names a run it cannot use and writes the rest, a run.entry
that keeps no records is still a run, rank lines are written whole, and a study's notes
do not contradict what it measured."""

from __future__ import annotations

import contextlib
import io
import json
import sys

import pytest
from omegaconf import OmegaConf

from ddp_lab.report.build import build_report
from ddp_lab.report.run import find_runs
from helpers import compose
from report_data import PAYLOAD, bench_run, train_run


def _set(run_dir, **sync):
    """Give a written run folder's config the sync options `sync` (as a sweep would)."""
    cfg = OmegaConf.load(run_dir / "config.yaml")
    for k, v in sync.items():
        cfg.sync[k] = v
    OmegaConf.save(cfg, run_dir / "config.yaml")


def test_settings_that_differ_are_two_series_never_repeats(tmp_path):
    """Tour stop 3: `-m sync=ring sync.prepost=false,true` is two settings: two series of
    one point each, not one point of two repeats averaged."""
    off = train_run(tmp_path / "runs", "off", sync="ring", world=3, epoch_s=(0.5, 0.37, 0.37))
    on = train_run(tmp_path / "runs", "on", sync="ring", world=3, epoch_s=(0.5, 0.28, 0.29))
    _set(off, prepost=False)
    _set(on, prepost=True)
    res = build_report(find_runs([tmp_path / "runs"]), tmp_path / "rep", make_plots=False)
    groups = res["doc"]["scaling"]
    assert sorted(g["sync"] for g in groups) == ["ring", "ring prepost=true"]
    assert all(r["time_n"] == 1 for g in groups for r in g["rows"])
    phases = res["doc"]["phases"]
    assert sorted(p["sync"] for p in phases) == ["ring", "ring prepost=true"]


def test_a_time_per_step_is_compared_across_epoch_counts(tmp_path):
    """A resumed run (7 epochs) and a fresh one (5): one workload for the phases (a step's
    time does not depend on the count), the title never "1 epochs"."""
    train_run(tmp_path / "runs", "five", epoch_s=(1.9,) + (1.2,) * 4)
    train_run(tmp_path / "runs", "seven", epoch_s=(1.9,) + (1.2,) * 6)
    train_run(tmp_path / "runs", "one", epoch_s=(1.9,), world=1)
    res = build_report(find_runs([tmp_path / "runs"]), tmp_path / "rep", make_plots=False)
    assert len({p["workload"] for p in res["doc"]["phases"]}) == 1, res["doc"]["phases"]
    assert "1 epochs" not in res["markdown"] and "1 epoch" in res["markdown"]


def test_labels_name_every_option_that_is_not_the_default():
    from ddp_lab.folder.description import describe_run, differing_labels

    def desc(*o, world=2):
        return describe_run(OmegaConf.to_container(compose(*o)), {"world_size": world})

    a, b = desc("sync=ring"), desc("sync=ring", "sync.prepost=true")
    assert (a.label(), b.label()) == ("ring_w2_mlp", "ring-prepost_w2_mlp")
    assert a.series != b.series and (a.sync_label(), b.sync_label()) == ("ring", "ring prepost=true")
    c, d = desc("sync=ddp"), desc("sync=ddp", "model=mlp_wide")
    assert c.label() != d.label()  # the mlp and mlp_wide runs of a sync sweep
    assert differing_labels([a, b]) == ["ring", "ring-prepost"]
    assert differing_labels([c, d]) == ["ddp_mlp", "ddp_mlp_wide"]
    h = desc("sync=hierarchical", "sync.inter=library", "sync.node_size=1", world=4)
    assert h.label() == "hierarchical-inter-library-node_size1_w4_mlp"
    hp = b.hparams()
    assert hp["sync.prepost"] is True and hp["world_size"] == 2
    from ddp_lab.folder.description import Description
    assert Description.from_hparams(hp).label() == "ring-prepost_w2_mlp"  # the TensorBoard run
    assert a.hparams()["sync.prepost"] is False  # every option, so the runs line up


def test_the_cost_model_answers_every_call_the_code_makes():
    """zero1's reduce-scatter and all-gather pad each bucket to world x SHARD_ALIGN
    elements: a prediction for any world pads as that world would (the report crashed on
    `159040 elements do not split into 128 pieces`)."""
    from ddp_lab.predict.costmodel import SHARD_ALIGN, SYNC_COLLECTIVES, cost, padded
    from ddp_lab.report.alpha_beta import Fit, predict_comm_s

    fit = Fit(1e-5, 1e-9, 3, "torch", "ring", "global", 2, 0.0)
    for sync in SYNC_COLLECTIVES:
        for n in (2, 3, 8, 16, 64, 128):
            for payload in (PAYLOAD, 20_041_748 * 4, 159_040):
                t = predict_comm_s(sync, n, payload, 2, fit)
                assert t is not None and t > 0, (sync, n, payload)
    assert padded("reduce_scatter", 39_760, 3) == 39_936 == 3 * SHARD_ALIGN * 208
    assert padded("all_reduce", 39_760, 3) == 39_760
    c = cost("reduce_scatter", "ring", padded("reduce_scatter", 39_760, 128), 128)
    assert c.sent[0] == 127 * padded("reduce_scatter", 39_760, 128) // 128 * 4


def test_forecast_over_a_wide_zero1_run(tmp_path):
    """`--forecast 8,16,32,64` over an mlp_wide zero1 run: no crash, a forecast or why not."""
    for n in (1, 2):
        train_run(tmp_path / "runs", f"z{n}", sync="zero1", model="mlp_wide", world=n,
                  epoch_s=(3.0, 2.0 / n, 2.0 / n))
    res = build_report(find_runs([tmp_path / "runs"]), tmp_path / "rep", make_plots=False,
                       forecast_worlds=[8, 16, 32, 64])
    assert not res["doc"]["skipped"]
    assert res["doc"]["forecast"]["series"][0]["sync"] == "zero1"


def test_a_run_the_report_cannot_use_is_named_and_the_rest_written(tmp_path, monkeypatch):
    from ddp_lab.report import tables

    good = train_run(tmp_path / "runs", "good", sync="ring")
    bad = train_run(tmp_path / "runs", "bad", sync="tree")
    real = tables.phase_rows

    def picky(runs):  # a table that cannot read the tree run, as the zero1 one could not
        if any(r.ok and r.get("sync") == "tree" for r in runs):
            raise ValueError("tree: a figure no table understands")
        return real(runs)

    monkeypatch.setattr(tables, "phase_rows", picky)
    res = build_report(find_runs([tmp_path / "runs"]), tmp_path / "rep", make_plots=False)
    skipped = {s["run"]: s["reason"] for s in res["doc"]["skipped"]}
    assert list(skipped) == [str(bad)]
    assert "the report cannot use it (ValueError: tree: a figure no table understands)" in skipped[str(bad)]
    assert [r["run"] for r in res["doc"]["phases"]] == [str(good)]


def test_a_run_entry_that_keeps_no_records_is_a_completed_run(tmp_path):
    """`run.entry=ddp_lab.rank.one_file` ended 0: summary.json says completed and that it keeps
    no records; status says so (not `not started`), the report says why no figures."""
    from ddp_lab.command.job import collect
    from ddp_lab.command.status import inspect
    from ddp_lab.command.status import one_line

    d = tmp_path / "one_file"
    d.mkdir()
    OmegaConf.save(compose("run.entry=ddp_lab.rank.one_file", "sync=ring", "launcher.nproc_per_node=2"),
                   d / "config.yaml")
    summary = collect(d, 0, launcher="local", sync="ring", entry="ddp_lab.rank.one_file")
    assert summary["status"] == "completed" and summary["records_kept"] is False
    info = inspect(d, scheduler=False)
    assert info["state"] == "completed" and "keeps no records" in info["detail"]
    assert "keeps no records" in one_line(info)
    run = find_runs([d])[0]
    assert not run.ok and "run.entry=ddp_lab.rank.one_file keeps no records" in run.status
    # the trainer's own entry without a summary is still a failure to report, not this
    e = tmp_path / "worker"
    e.mkdir()
    assert collect(e, 0, entry="ddp_lab.worker") == {}
    f = tmp_path / "failed"
    f.mkdir()
    assert collect(f, 1, entry="ddp_lab.rank.one_file")["status"].startswith("failed")


class _Raw(io.RawIOBase):
    """A console that records each write it gets."""

    def __init__(self):
        self.writes = []

    def writable(self):
        return True

    def write(self, b):
        self.writes.append(bytes(b))
        return len(b)


@pytest.mark.parametrize("how", ["forked", "spawned"])
def test_a_ranks_line_is_one_write(how, monkeypatch):
    """Ranks share the console: `print`'s text and newline as two writes (a rank started
    as `python -u`: unbuffered) let another rank's line land between them (`... 5.01
    ms/step[rank 0] epoch 0: ...`). A forked rank (whole_lines) and a spawned one
    (ddp_lab.rank.main, which torchrun starts every other entry through) write a
    line at once."""
    from ddp_lab.rank.main import whole_lines

    raw = _Raw()
    stream = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)  # as `python -u`
    monkeypatch.setattr(sys, "stdout", stream)
    monkeypatch.setattr(sys, "stderr", stream)
    if how == "forked":
        whole_lines()
        print("[rank 1] epoch 0: loss 0.1, sync (ring) 5.01 ms/step")
    else:  # any module, as `python -m MODULE` would run it: the stdlib's `platform`
        from ddp_lab.rank.main import main as whole_lines_main

        monkeypatch.setattr(sys, "argv", ["whole_lines", "platform"])
        with contextlib.suppress(SystemExit):
            whole_lines_main()
    stream.flush()
    assert raw.writes and all(w.endswith(b"\n") for w in raw.writes), raw.writes  # no part of a line
    if how == "forked":
        assert raw.writes == [b"[rank 1] epoch 0: loss 0.1, sync (ring) 5.01 ms/step\n"]


def test_a_study_says_why_no_comm_fit_without_contradicting_itself(tmp_path):
    """Worlds 1 and 2, no bench: the held-out check fits on world 1 alone; it says so,
    not "no multi-rank point" under a study that measured world 2."""
    for n in (1, 2):
        train_run(tmp_path / "runs", f"w{n}", sync="ring", world=n, epoch_s=(1.0, 0.5, 0.5), steps=50)
    res = build_report(find_runs([tmp_path / "runs"]), tmp_path / "rep", make_plots=False)
    why = res["doc"]["forecast"]["series"][0]["heldout"]["why_not"]
    assert "no multi-rank point at the fitted world(s) <= 1 (the largest world is held out)" in why
    assert "no bench run and no multi-rank point" not in res["markdown"] + res["summary"]


def test_the_comm_note_advises_a_bench_only_where_none_is_the_runs_own():
    from ddp_lab.report.summary import comm_model_note

    own = [{"ratio": 3.0, "fit_source": "same allocation: bench_local_x"}]
    other = [{"ratio": 3.0, "fit_source": "fit at world 4: bench_local_y"}]
    assert "try a bench on the runs' own allocation" not in comm_model_note(own).lower()
    assert "own allocation already" in comm_model_note(own)
    assert "Try a bench on the runs' own allocation" in comm_model_note(other)


def test_a_study_point_is_named_by_what_it_is_in_status(tmp_path):
    """A study's point folders are `points/w2_r1`: status names each by its description
    (sync, world, model, repeat), not by `w2_r1` alone."""
    from omegaconf import open_dict

    from ddp_lab.command.status import inspect
    from ddp_lab.command.status import one_line

    d = tmp_path / "study" / "points" / "w2_r1"
    d.mkdir(parents=True)
    cfg = compose("sync=ring", "sync.prepost=true", "launcher.nproc_per_node=2")
    with open_dict(cfg):
        cfg.study_point = {"id": "s", "world": 2, "repeat": 1, "index": 2}
    OmegaConf.save(cfg, d / "config.yaml")
    (d / "summary.json").write_text(json.dumps({"status": "completed", "world_size": 2,
                                                 "nodes": 1, "epochs_done": 5, "epochs": 5}))
    line = one_line(inspect(d, scheduler=False))
    assert line.startswith("w2_r1 (ring-prepost_w2_mlp_r1) ") and "completed" in line, line
