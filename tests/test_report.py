"""ddp_lab.report: the alpha-beta fit, run-folder discovery and status, and a report over
real short training runs (1 and 2 ranks), a failed run and a bench run."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from helpers import run_cli, run_dir_of
from test_report_plots import legend_clear_of_axes

from ddp_lab.predict.costmodel import cost
from ddp_lab.report import plots
from ddp_lab.report.alpha_beta import fit_alpha_beta, predict_comm_s
from ddp_lab.report.run import ReportError, find_runs
from ddp_lab.report.tables import sig

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------- the model
def _bench_rows(alpha, beta, n, impl="torch", algorithm="ring", sizes=range(10, 24, 2)):
    rows = []
    for k in sizes:
        nbytes = 4 * 2 ** k
        t = cost("all_reduce", impl, 2 ** k, n, 4).time(alpha, beta)
        rows.append({"op": "all_reduce", "impl": impl, "group": "global", "group_size": n,
                     "bytes": nbytes, "elements": 2 ** k, "time_median_s": t, "correct": True})
    return rows


@pytest.mark.parametrize("n,impl", [(2, "torch"), (4, "torch"), (4, "butterfly"), (3, "tree")])
def test_fit_recovers_alpha_and_beta(n, impl):
    alpha, beta = 50e-6, 1 / 2e9  # 50 µs, 2 GB/s
    algorithm = "ring" if impl == "torch" else impl
    rows = _bench_rows(alpha, beta, n, impl, algorithm)
    rows.append({**rows[0], "correct": False, "time_median_s": 1.0})  # a wrong point is ignored
    fit = fit_alpha_beta(rows)
    assert fit.impl == impl and fit.algorithm == algorithm and fit.n == n
    assert math.isclose(fit.alpha_s, alpha, rel_tol=1e-9)
    assert math.isclose(fit.beta_s_per_byte, beta, rel_tol=1e-9)
    assert fit.rel_rms < 1e-9 and math.isclose(fit.bandwidth_GBps, 2.0, rel_tol=1e-9)


def test_fit_never_returns_a_negative_latency():
    # pure bandwidth points with noise that would pull the intercept below zero
    rows = _bench_rows(0.0, 1e-9, 2)
    rows[0]["time_median_s"] *= 0.5
    fit = fit_alpha_beta(rows)
    assert fit.alpha_s >= 0 and fit.beta_s_per_byte > 0


def test_predictions_follow_the_formulas():
    alpha, beta = 10e-6, 1e-9
    from ddp_lab.report.alpha_beta import Fit

    fit = Fit(alpha, beta, 5, "torch", "ring", "global", 4, 0.0)
    m, n = 4.8e6, 4  # m/3 whole bytes: the model counts whole bytes
    ring = 2 * (n - 1) * alpha + 2 * (n - 1) / n * m * beta
    assert math.isclose(predict_comm_s("ring", n, m, 1, fit), ring)
    # ddp: a ring all-reduce per bucket; 3 buckets share the bytes, pay 3x the latency
    three = 3 * (2 * (n - 1) * alpha + 2 * (n - 1) / n * (m / 3) * beta)
    assert math.isclose(predict_comm_s("ddp", n, m, 3, fit), three)
    assert math.isclose(predict_comm_s("tree", n, m, 1, fit), 2 * 2 * (alpha + m * beta))
    assert math.isclose(predict_comm_s("butterfly", n, m, 1, fit), 2 * (alpha + m * beta))
    # the library's reduce as gloo runs it (ring reduce-scatter, gather: n steps, 2(n-1)/n m
    # through the root), then its binomial-tree broadcast (log2 n rounds of m), as the
    # synchroniser's recorded bytes (ddp_lab.predict.costmodel)
    rb = n * alpha + 2 * (n - 1) / n * m * beta + 2 * (alpha + m * beta)
    assert math.isclose(predict_comm_s("reduce_broadcast", n, m, 1, fit), rb)
    # a synchroniser that records the reduce and the broadcast as two calls of m bytes each
    assert math.isclose(predict_comm_s("reduce_broadcast", n, 2 * m, 2, fit), rb)
    assert predict_comm_s("ddp", 1, m, 1, fit) == 0.0
    assert predict_comm_s("my_new_sync", n, m, 1, fit) is None  # any sync name is handled


# ----------------------------------------------------------- discovery, status
def _fake_run(root: Path, name: str, world: int, epoch_s: float, sync="ddp", status="completed",
              summary=True, records=1, dry=False, phases=True) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(
        f"launcher:\n  name: local\n  nodes: 1\n  nproc_per_node: {world}\n  dry_run: {str(dry).lower()}\n"
        f"sync:\n  name: {sync}\nmodel:\n  name: mlp\ntrain:\n  epochs: 2\n  batch_size: 64\n"
        "  max_steps_per_epoch: 0\n")
    rec = {"epoch": 1, "steps": 10, "samples_per_s": 100.0 * world,
           "phase_s": {p: {"mean": 0.001} for p in ("data", "forward", "backward", "sync", "optim", "step")},
           "comm": {"time_s": 0.01, "payload_bytes": 10 * 159_010 * 4, "calls": 10}}
    if not phases:  # timing.enabled=false: no phase times
        del rec["phase_s"]
    (d / "metrics.jsonl").write_text("".join(json.dumps(rec) + "\n" for _ in range(records)))
    if summary:
        (d / "summary.json").write_text(json.dumps({
            "status": status, "launcher": "local", "sync": sync, "backend": "gloo", "device": "cpu",
            "nodes": 1, "nproc_per_node": world, "world_size": world, "epochs": 2,
            "test_accuracy": 0.9, "epoch_time_s_median": epoch_s, "epoch_time_s_mean": epoch_s,
            "comm_fraction": 0.25, "hosts": ["h"]}))
    return d


def test_statuses_and_speedups_from_summaries(tmp_path):
    root = tmp_path / "outputs"
    _fake_run(root, "a_ddp_1", 1, 8.0)
    _fake_run(root, "b_ddp_2", 2, 5.0)
    _fake_run(root, "c_ddp_4", 4, 4.0)
    _fake_run(root, "d_ring_2", 2, 6.0, sync="ring")
    _fake_run(root, "e_ring_4", 4, 2.0, sync="ring")
    _fake_run(root, "f_failed", 2, 1.0, status="failed: RuntimeError: boom")
    _fake_run(root, "g_killed", 2, 1.0, summary=False)
    _fake_run(root, "h_dry", 2, 1.0, summary=False, records=0, dry=True)
    bad = _fake_run(root, "i_garbled", 2, 1.0)
    (bad / "summary.json").write_text("{not json")
    (root / "sweeps" / "x").mkdir(parents=True)  # no run folder: ignored
    (root / "a_ddp_1" / "tb").mkdir()
    (root / "a_ddp_1" / "tb" / "config.yaml").write_text("x: 1\n")  # inside a run: not a run

    proc = run_cli(str(root), "-o", str(tmp_path / "rep"), cwd=tmp_path, module="ddp_lab.report")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "rep" / "report.json").read_text())
    by_sync = {g["sync"]: g for g in doc["scaling"]}
    ddp = {r["world_size"]: r for r in by_sync["ddp"]["rows"]}
    assert ddp[2]["speedup"] == pytest.approx(8 / 5) and ddp[4]["speedup"] == pytest.approx(2.0)
    assert ddp[4]["efficiency"] == pytest.approx(0.5)
    ring = {r["world_size"]: r for r in by_sync["ring"]["rows"]}  # baseline = its own smallest
    assert by_sync["ring"]["baseline_world_size"] == 2
    assert ring[4]["speedup"] == pytest.approx(3.0) and ring[4]["efficiency"] == pytest.approx(1.5)
    reasons = {Path(s["run"]).name: s["reason"] for s in doc["skipped"]}
    assert reasons["f_failed"] == "failed: RuntimeError: boom"
    assert reasons["g_killed"].startswith("incomplete: 1 of 2 epoch(s) logged")
    assert reasons["h_dry"] == "dry run: nothing was started"
    assert "summary.json is unreadable" in reasons["i_garbled"]
    assert len(reasons) == 4 and len(doc["scaling"]) == 2
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Skipped run folders" in md and "f_failed" in md and "boom" in md
    # one repeat per point: no interval, the speedup still against the smallest world
    assert "| 1x4 | 4 | local | gloo | 1 | 4.000 | – | – | 2.00 | – | 50% | – | 25% | -- |" in md
    assert "No completed bench run" in md
    with open(tmp_path / "rep" / "report.csv") as f:
        assert len(list(csv.DictReader(f))) == 5
    for fig in doc["figures"]:
        assert (tmp_path / "rep" / fig["file"]).read_bytes()[:8] == PNG_MAGIC
    assert {"ddp", "ring"} == set(json.loads(
        (tmp_path / "rep" / "epoch_time_vs_world.json").read_text())["series"])


@pytest.mark.slow
def test_bad_paths_are_one_line_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    for path, message in (("empty", "no run folders under"), ("missing", "no such file or folder"),
                          ("file.txt", "not a folder")):
        with pytest.raises(ReportError, match=message):
            find_runs([tmp_path / path])
    proc = run_cli(str(tmp_path / "empty"), cwd=tmp_path, module="ddp_lab.report")
    assert proc.returncode == 2 and proc.stderr.startswith("error: no run folders under")
    assert "Traceback" not in proc.stderr and not (tmp_path / "report").exists()
    dry = tmp_path / "dry" / "2026-11-26_10-00-00_ddp_mlp_local"  # what a dry run leaves
    (dry / "logs").mkdir(parents=True)
    (dry / "config.yaml").write_text("launcher:\n  dry_run: true\n")
    (dry / "DRY_RUN").write_text("")
    with pytest.raises(ReportError, match=r"holds only dry runs \(1\): rendered, never started"):
        find_runs([tmp_path / "dry"])
    proc = run_cli(cwd=tmp_path, module="ddp_lab.report")  # no path at all: argparse's usage
    assert proc.returncode == 2 and "usage:" in proc.stderr and "Traceback" not in proc.stderr


def test_runs_without_phase_times_get_no_phase_figure(tmp_path):
    """timing.enabled=false runs have no phase times: the report has no bars to draw, so
    no phases.png, and the rest of the report as usual (it crashed drawing zero panels)."""
    root = tmp_path / "outputs"
    _fake_run(root, "a_ddp_1", 1, 8.0, phases=False)
    _fake_run(root, "b_ddp_2", 2, 5.0, phases=False)
    proc = run_cli(str(root), "-o", str(tmp_path / "rep"), cwd=tmp_path, module="ddp_lab.report")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "rep" / "report.json").read_text())
    files = {fig["file"] for fig in doc["figures"]}
    assert "epoch_time_vs_world.png" in files and "phases.png" not in files, files


# ---------------------------------------------------------------- real runs
@pytest.fixture(scope="module")
def real_runs(tmp_path_factory, shared_data_root):
    """Two short training runs (1 and 2 ranks, 2 epochs: the first is warm-up), a failed
    one, a 2-rank bench run."""
    root = tmp_path_factory.mktemp("report-runs")
    out = root / "outputs"
    runs = {}
    for n in (1, 2):
        proc = run_cli("train.epochs=2", "train.max_steps_per_epoch=20",
                       f"launcher.nproc_per_node={n}", f"data.root={shared_data_root}",
                       f"run.root={out}", "log.progress=lines", cwd=root, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs[n] = run_dir_of(proc)
    proc = run_cli("train.epochs=1", f"data.root={root / 'nodata'}", f"data.mirrors=[{root / 'nowhere'}]",
                   "launcher.nproc_per_node=1", f"run.root={out}", cwd=root, timeout=300)
    assert proc.returncode != 0
    runs["failed"] = run_dir_of(proc)
    proc = run_cli("launcher.nproc_per_node=2", "bench.max_elements=1048576", "bench.points=6",
                   "bench.warmup=1", "bench.iters=5", "log.progress=lines", f"run.root={out}",
                   cwd=root, module="ddp_lab.bench", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs["bench"] = run_dir_of(proc)
    return root, out, runs


def _epoch_times(run: Path) -> list[float]:
    return [json.loads(x)["epoch_time_s"] for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.dist
@pytest.mark.slow
def test_report_on_real_runs(real_runs):
    root, out, runs = real_runs
    rep = root / "report"
    proc = run_cli(str(out), "-o", str(rep), cwd=root, module="ddp_lab.report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 training run(s), 1 bench run(s), 1 skipped" in proc.stdout
    # the screen: the comparison, the verdicts, the plots; report.md keeps the rest
    screen = proc.stdout.splitlines()
    assert len(screen) <= 40, proc.stdout
    assert "| nodes x procs |" not in proc.stdout and f"Full report: {rep / 'report.md'}" in screen
    table = [ln for ln in screen if ln.startswith("  sync ") or ln.startswith("  ddp  ")]
    assert [ln.split()[:4] for ln in table[1:]] == [["ddp", "1", "1x1", "1"], ["ddp", "2", "1x2", "1"]]
    assert max(map(len, table)) <= 100, table
    assert f"skipped {runs['failed'].name}: failed:" in proc.stdout
    assert all(f"  {rep / f}" in screen for f in ("epoch_time_vs_world.png", "phases.png",
                                                  "bench_all_reduce.png"))
    doc = json.loads((rep / "report.json").read_text())
    (group,) = doc["scaling"]
    s1 = json.loads((runs[1] / "summary.json").read_text())
    s2 = json.loads((runs[2] / "summary.json").read_text())
    rows = {r["world_size"]: r for r in group["rows"]}
    assert group["sync"] == "ddp" and group["baseline_world_size"] == 1
    # the second epoch's time: the first is warm-up
    t1, t2 = (_epoch_times(runs[n])[1] for n in (1, 2))
    expected = t1 / t2
    assert rows[2]["epoch_time_s_mean"] == t2 and rows[2]["time_n"] == 1
    assert rows[2]["speedup"] == pytest.approx(expected, rel=1e-12)
    # 20 steps per rank per epoch: twice the work at 2 ranks, so efficiency = speedup
    assert rows[2]["efficiency"] == pytest.approx(expected, rel=1e-12)
    assert rows[2]["comm_fraction"] == s2["comm_fraction"]
    assert rows[2]["test_accuracy"] == s2["test_accuracy"]
    # the failed run is listed with its reason
    (skipped,) = doc["skipped"]
    assert skipped["run"] == str(runs["failed"]) and skipped["reason"].startswith("failed:")
    assert "could not fetch" in skipped["reason"]
    md = (rep / "report.md").read_text()
    assert runs["failed"].name in md and "## Skipped run folders" in md
    assert (f"| 1x2 | 2 | local | gloo | 1 | {t2:.3f} | – | – | "
            f"{expected:.2f} |") in md
    # the bench run is handled separately: fitted, and set against the training comm
    assert doc["bench_runs"] == [str(runs["bench"])]
    (fit,) = doc["fits"]
    assert fit["primary"]["impl"] == "torch" and fit["primary"]["n"] == 2
    # noisy points may show no latency (or no bandwidth) term: the fit clamps it at 0
    assert fit["primary"]["alpha_us"] >= 0 and fit["primary"]["beta_ns_per_byte"] >= 0
    assert fit["primary"]["alpha_us"] + fit["primary"]["beta_ns_per_byte"] > 0
    comm = {r["world_size"]: r for r in doc["comm_model"]}
    assert comm[2]["fit_source"].startswith("same allocation: ") and comm[2]["predicted_ms"] > 0
    assert comm[2]["measured_comm_ms"] > 0 and comm[2]["payload_MB_per_step"] == pytest.approx(
        (784 * 50 + 50 + 50 * 10 + 10) * 4 / 1e6)
    assert "alpha-beta model vs measured" in md
    files = {f["file"] for f in doc["figures"]}
    assert files == {"epoch_time_vs_world.png", "phases.png", "bench_all_reduce.png"}
    for f in files:
        assert (rep / f).read_bytes()[:8] == PNG_MAGIC and (rep / f).stat().st_size > 10_000
    # the figure as drawn: the legend clear of every axes, one row per workload, from zero
    fig, _ = plots.epoch_time_figure(doc["scaling"])
    legend_clear_of_axes(fig)
    assert len(fig.axes) == 2 and all(ax.get_ylim()[0] == 0 for ax in fig.axes)
    phases = json.loads((rep / "phases.json").read_text())
    assert phases["series"] == ["data", "forward", "backward", "sync", "optim", "comm"]
    assert phases["bars"] == ["1 rank\n1 run", "2 ranks\n1 run"]


@pytest.mark.dist
@pytest.mark.slow
def test_real_runs_fingerprint_and_forecast(real_runs):
    """The runs' fingerprints (one allocation: one id), and the forecast's held-out check on
    real runs: compute per step from the 1-rank run, comm from the bench's alpha-beta fit,
    world 2 predicted and set against its measured time."""
    root, out, runs = real_runs
    rep = root / "report-forecast"
    proc = run_cli(str(out), "-o", str(rep), "--no-plots", "--forecast", "8,16", "--gpus-per-node",
                   "2", cwd=root, module="ddp_lab.report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((rep / "report.json").read_text())
    s1, s2 = (json.loads((runs[n] / "summary.json").read_text()) for n in (1, 2))
    fp = s2["fingerprint"]
    assert fp["backend"] == "gloo" and fp["gloo"] is True and fp["device"] == "cpu"
    assert fp["hosts"] == s2["hosts"] and fp["nproc_per_node"] == 2 and fp["cpu"]
    assert fp["nccl_transport"] is None and fp["torch"] == s2["torch"]
    assert s1["fingerprint_id"] == s2["fingerprint_id"] and len(s2["fingerprint_id"]) == 10
    (group,) = doc["scaling"]
    assert list(group["fingerprints"]) == [s2["fingerprint_id"]] and not group["fingerprint_notes"]
    (series,) = doc["forecast"]["series"]
    h = series["heldout"]
    assert h["fitted_worlds"] == [1] and h["predicted_world"] == 2
    assert h["comm_fit"].startswith("bench: ") and h["predicted_s"] > 0
    assert h["measured_s"] == _epoch_times(runs[2])[1]
    assert h["rel_error"] == pytest.approx((h["predicted_s"] - h["measured_s"]) / h["measured_s"])
    preds = {(p["world"], p["mode"]): p for p in series["predictions"]}
    assert preds[(16, "weak")]["nodes"] == 8 and preds[(16, "weak")]["epoch_s"] > 0
    assert preds[(8, "strong")]["batch_per_rank"] == pytest.approx(64 / 8)
    md = (rep / "report.md").read_text()
    assert "## Forecast" in md and f"predicted world 2: {sig(h['predicted_s'])} s" in md
    # shown with its held-out error; marked where that error is beyond the target
    assert series["shown"] and series["reliable"] == (abs(h["rel_error"]) <= 0.25
                                                      and all(abs(f["rel_error"]) <= 0.25
                                                              for f in series["fit_check"]))
    assert ("**UNRELIABLE**" in md) != series["reliable"]
    assert ("UNRELIABLE" in proc.stdout) != series["reliable"]
    print(f"held-out error on real runs: {h['rel_error']:+.1%}")
