"""The scaling report's statistics: repeats grouped (mean, std, 95% CI of post-warm-up epoch
times), no speedup between repeats, intervals on speedup and efficiency, a comparison
across fingerprints flagged, and the forecast's held-out error on synthetic runs whose
truth is known. Run folders are written here as the trainer writes them (records.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import run_cli

from ddp_lab.report import tables
from ddp_lab.report.tables import sig
from ddp_lab.report.__main__ import parse_worlds
from ddp_lab.report.build import build_report
from ddp_lab.report.run import find_runs


def test_summary_on_known_numbers():
    s = tables.summarize([10.0, 12.0, 14.0])
    assert s.n == 3 and s.mean == 12.0 and s.std == pytest.approx(2.0)
    # the interval: Student t on the logs, exponentiated (t(0.975, 2) = 4.3027)
    logs = [math.log(v) for v in (10.0, 12.0, 14.0)]
    centre = sum(logs) / 3
    sd = math.sqrt(sum((x - centre) ** 2 for x in logs) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)
    assert s.ci95 == pytest.approx((math.exp(centre - half), math.exp(centre + half)))
    assert s.ci95[0] < 12.0 < s.ci95[1]
    one = tables.summarize([5.0])
    assert one.n == 1 and one.std is None and one.ci95 is None
    assert tables.summarize([]) is None


def test_intervals_stay_positive_and_need_three_repeats():
    # a t-interval on the times themselves: 0.733 +- 4.30 x 1.097 / sqrt(3) = [-1.99, 3.46]
    wide = tables.summarize([0.1, 0.1, 2.0])
    assert 0 < wide.ci95[0] < 0.1 and wide.ci95[1] > 2.0
    # two repeats: t(0.975, 1) = 12.7, no interval is worth printing
    two = tables.summarize([2.1, 2.5])
    assert two.n == 2 and two.std == pytest.approx(math.sqrt(0.08)) and two.ci95 is None
    assert tables.ratio(two, wide) == (pytest.approx(2.3 / 0.7333333), None)
    sp, (lo, hi) = tables.ratio(tables.summarize([4.0, 4.2, 3.8]), wide)
    assert 0 < lo < sp < hi


def test_ratio_interval_delta_method():
    a, b = tables.summarize([10.0, 12.0, 14.0]), tables.summarize([5.0, 6.0, 7.0])
    r, ci = tables.ratio(a, b)
    assert r == pytest.approx(2.0)
    rel = math.sqrt((2 / 12) ** 2 / 3 + (1 / 6) ** 2 / 3)  # equal relative spreads
    df = (2 * (rel ** 2 / 2)) ** 2 / (2 * (rel ** 2 / 2) ** 2 / 2)  # Welch: 4
    assert df == pytest.approx(4.0)
    half = 2.7764451051977987 * rel  # t(0.975, 4), on the log of the ratio
    assert ci == pytest.approx((2.0 * math.exp(-half), 2.0 * math.exp(half)))
    assert tables.ratio(a, tables.summarize([6.0]))[1] is None  # one repeat: no interval


def test_parse_worlds():
    assert parse_worlds("8,16,...,128") == [8, 16, 32, 64, 128]
    for bad in ("0,2", "x", "...,8", ""):
        with pytest.raises(ValueError):
            parse_worlds(bad)


# -------------------------------------------------------------- synthetic run folders
FP = {"hosts": ["h"], "cpu": "Test CPU", "gpu": None, "torch": "2.x", "nccl": None,
      "backend": "gloo", "nccl_transport": None, "env": {"OMP_NUM_THREADS": "1"}}


def write_run(root: Path, name: str, world: int, epoch_times: list[float], sync="ring",
              steps=20, comm_s_per_step=0.0, fp=FP, fid="aaaaaaaaaa", batch=64,
              payload=159_010 * 4, phase_ms: dict | None = None, nodes: int = 1) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(
        f"launcher:\n  name: local\n  nodes: {nodes}\n  nproc_per_node: {world // nodes}\n  dry_run: false\n"
        f"sync:\n  name: {sync}\nmodel:\n  name: mlp\noptim:\n  name: adam\ndata:\n  pipeline: tensor\n"
        f"train:\n  epochs: {len(epoch_times)}\n  batch_size: {batch}\n  max_steps_per_epoch: {steps}\n")
    calls = 1 if world > 1 else 0
    with open(d / "metrics.jsonl", "w") as f:
        for i, t in enumerate(epoch_times):
            f.write(json.dumps({"epoch": i + 1, "world_size": world, "epoch_time_s": t, "steps": steps,
                                "samples_per_s": steps * batch * world / t,
                                "comm": {"time_s": comm_s_per_step * steps, "calls": calls * steps,
                                         "payload_bytes": payload * steps * calls},
                                **({"phase_s": {p: {"mean": v / 1e3} for p, v in phase_ms.items()}}
                                   if phase_ms else {})}) + "\n")
    (d / "summary.json").write_text(json.dumps({
        "status": "completed", "launcher": "local", "sync": sync, "backend": "gloo",
        "device": "cpu", "nodes": nodes, "nproc_per_node": world // nodes, "world_size": world,
        "epochs": len(epoch_times), "test_accuracy": 0.9, "batch_size": batch,
        "epoch_time_s_median": sorted(epoch_times)[len(epoch_times) // 2],
        "epoch_time_s_mean": sum(epoch_times) / len(epoch_times), "comm_fraction": 0.2,
        "hosts": fp["hosts"], "fingerprint": fp, "fingerprint_id": fid}))
    return d


def test_repeats_grouped_never_a_speedup_between_them(tmp_path):
    # two repeats of one config at one world: mean and CI, no speedup; the warm-up epoch
    # (9.0 s) is left out
    write_run(tmp_path / "runs", "r1", 2, [9.0, 2.0, 2.2])
    write_run(tmp_path / "runs", "r2", 2, [9.0, 2.4, 2.6])
    res = build_report(find_runs([tmp_path / "runs"]), tmp_path / "rep", make_plots=False)
    (g,) = res["doc"]["scaling"]
    (row,) = g["rows"]
    assert row["time_n"] == 2 and row["repeat_values_s"] == pytest.approx([2.1, 2.5])
    assert row["epoch_time_s_mean"] == pytest.approx(2.3) and row["warmup_epochs"] == [1]
    assert row["epoch_time_s_std"] == pytest.approx(math.sqrt(0.08))
    assert row["epoch_time_s_ci95"] is None  # two repeats: not meaningful, and said so
    assert row["speedup"] is None and row["efficiency"] is None
    assert "EXCLUDING WARM-UP" in res["markdown"]
    assert "| 2 | 2.300 | 0.283 | n=2: not meaningful | – | – |" in res["markdown"]
    # --warmup 0 keeps the first epoch
    res0 = build_report(find_runs([tmp_path / "runs"]), tmp_path / "rep0", make_plots=False, warmup=0)
    assert res0["doc"]["scaling"][0]["rows"][0]["epoch_time_s_mean"] == pytest.approx((13.2 + 14.0) / 6)


def test_speedup_with_intervals_and_cross_fingerprint_flag(tmp_path):
    root = tmp_path / "study" / "points"  # a study folder, nested two deep
    for k, (a, b) in enumerate(((4.0, 4.2), (3.8, 4.0), (4.1, 4.3))):
        write_run(root, f"w1_r{k}", 1, [9.0, a, b])
        write_run(root, f"w2_r{k}", 2, [9.0, a / 2 + 0.1, b / 2 + 0.1])
    other = {**FP, "cpu": "Other CPU", "env": {"OMP_NUM_THREADS": "2"}}
    write_run(root, "w4_r0", 4, [9.0, 1.2, 1.2], fp=other, fid="bbbbbbbbbb")
    # the study's own files (its plan; a config of its own) do not make it a run folder
    (tmp_path / "study" / "study.json").write_text("{}")
    (tmp_path / "study" / "config.yaml").write_text("study:\n  worlds: [1, 2, 4]\n")
    proc = run_cli(str(tmp_path / "study"), "-o", str(tmp_path / "rep"), "--no-plots",
                   cwd=tmp_path, module="ddp_lab.report")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "rep" / "report.json").read_text())
    (g,) = doc["scaling"]
    rows = {r["world_size"]: r for r in g["rows"]}
    assert rows[1]["time_n"] == 3 and rows[2]["time_n"] == 3 and rows[4]["time_n"] == 1
    t1 = sum((a + b) / 2 for a, b in ((4.0, 4.2), (3.8, 4.0), (4.1, 4.3))) / 3
    t2 = sum((a + b) / 4 + 0.1 for a, b in ((4.0, 4.2), (3.8, 4.0), (4.1, 4.3))) / 3
    assert rows[2]["speedup"] == pytest.approx(t1 / t2)
    # 20 steps per rank per epoch at every world: twice the work at world 2, so efficiency
    # = speedup x 2 ranks' work / 2 ranks (1 = the same time per epoch)
    assert rows[2]["efficiency"] == pytest.approx(t1 / t2)
    lo, hi = rows[2]["speedup_ci95"]
    assert lo < t1 / t2 < hi and rows[2]["efficiency_ci95"] == pytest.approx([lo, hi])
    assert rows[1]["speedup"] == 1.0 and rows[1]["speedup_ci95"] is None  # itself: exactly 1
    assert rows[4]["speedup_ci95"] is None  # one repeat: no interval
    assert not rows[2]["cross_fingerprint"] and rows[4]["cross_fingerprint"]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert ("⚠ Across fingerprints: world 4 (fingerprint bbbbbbbbbb) is compared with world 1 "
            "(fingerprint aaaaaaaaaa): cpu: Test CPU vs Other CPU; env OMP_NUM_THREADS: 1 vs 2.") in md
    assert sorted(doc["scaling"][0]["fingerprints"]) == ["aaaaaaaaaa", "bbbbbbbbbb"]


ALPHA, BETA, C, STEPS, PAYLOAD = 50e-6, 2e-9, 0.004, 20, 159_010 * 4


def law_comm(n: int) -> float:
    """Ring comm per step of ALPHA and BETA: the forecast's own law."""
    return 0.0 if n == 1 else 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * PAYLOAD * BETA


def write_law_runs(root: Path, slow8: float = 1.0) -> None:
    """Runs at worlds 1, 2, 4, 8 (2 repeats) made by the law; world 8 `slow8` times slower."""
    for n in (1, 2, 4, 8):
        for k in range(2):
            jitter = (1 + 0.002 * (k - 0.5)) * (slow8 if n == 8 else 1.0)
            t = STEPS * (C + law_comm(n)) * jitter
            write_run(root, f"w{n}_r{k}", n, [3 * t, t, t], comm_s_per_step=law_comm(n) * jitter)


def test_forecast_heldout_on_synthetic_runs(tmp_path):
    """Runs made by the model's own law (compute per step fixed, ring comm of alpha and
    beta known): fitted on worlds 1, 2, 4 the forecast finds world 8 within 1%, and its
    forecast for 16.. follows the law; the screen shows it with its held-out error."""
    write_law_runs(tmp_path / "runs")
    proc = run_cli(str(tmp_path / "runs"), "-o", str(tmp_path / "rep"), "--no-plots", "--forecast",
                   "16,...,64", "--gpus-per-node", "4", cwd=tmp_path, module="ddp_lab.report")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "rep" / "report.json").read_text())
    (s,) = doc["forecast"]["series"]
    h = s["heldout"]
    assert h["fitted_worlds"] == [1, 2, 4] and h["predicted_world"] == 8
    assert abs(h["rel_error"]) < 0.01, h
    assert s["shown"] and s["reliable"] and all(abs(f["rel_error"]) < 0.01 for f in s["fit_check"])
    pred = {(p["world"], p["mode"]): p for p in s["predictions"]}
    assert [w for w, m in pred if m == "weak"] == [16, 32, 64]
    want = STEPS * (C + law_comm(32))
    assert pred[(32, "weak")]["epoch_s"] == pytest.approx(want, rel=0.02)
    assert pred[(32, "weak")]["nodes"] == 8
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Forecast" in md and "Held-out check: fitted on worlds [1, 2, 4], predicted world 8" in md
    assert "fitted on the study's own comm per step" in md
    assert f"| 32 | 8 | {sig(pred[(32, 'weak')]['epoch_s'])} |" in md  # 3 significant digits
    # the screen: the forecast with its held-out error beside it
    flat = " ".join(proc.stdout.split())  # wrapped at 100 columns
    assert (f"ring: held-out error {h['rel_error']:+.0%} (target ±25%); weak scaling: 16 ranks "
            ) in flat, proc.stdout
    assert f"32 ranks {sig(pred[(32, 'weak')]['epoch_s'])} s" in flat


def test_forecast_beyond_its_target_is_marked_unreliable(tmp_path):
    """World 8 measured twice as slow as the law: the held-out error (-50%) is beyond the
    25% target, so the forecast is marked UNRELIABLE and its numbers stay off the screen;
    a series whose held-out check cannot be made shows no forecast at all."""
    write_law_runs(tmp_path / "runs", slow8=2.0)
    for n in (1, 2):  # one repeat each of another workload, no comm fit without world 2
        write_run(tmp_path / "runs", f"other_w{n}", n, [1.0, 0.5, 0.5], steps=50)
    res = build_report(find_runs([tmp_path / "runs"]), tmp_path / "rep", make_plots=False,
                       forecast_worlds=[16, 1024], gpus_per_node=4)
    law, other = sorted(res["doc"]["forecast"]["series"], key=lambda s: s["workload"])
    assert law["heldout"]["rel_error"] == pytest.approx(-0.5, abs=0.01)
    assert law["shown"] and not law["reliable"]
    assert other["heldout"]["rel_error"] is None and not other["shown"] and other["predictions"]
    md = res["markdown"]
    assert "**UNRELIABLE**: held-out world 8 off by -50% (target ±25%)" in md
    assert "No forecast: no held-out check (no comm fit" in md
    screen = res["summary"]
    assert "ring · mlp, batch 64/rank, 20 steps/epoch: UNRELIABLE: held-out world 8 off by -50%" in screen
    assert "1024 ranks" not in screen and "no forecast: no held-out check" in screen
    assert len(screen.splitlines()) <= 40, screen


def test_forecast_counts_ranks_sharing_cores(tmp_path):
    """CPU runs of 1, 2 and 4 ranks on a 2-core node (fingerprint cpu_count 2): at 4 ranks
    every rank runs half the time. Fitted on 1 and 2, world 4 comes out right only when
    the forecast counts that share."""
    c, alpha, steps = 0.004, 1e-3, 20
    fp = {**FP, "cpu_count": 2}

    def comm(n):
        return 2 * (n - 1) * alpha

    for n in (1, 2, 4):
        share = max(1, n / 2)
        for k in range(2):
            j = 1 + 0.002 * (k - 0.5)
            t = steps * share * (c + comm(n)) * j
            write_run(tmp_path / "runs", f"w{n}_r{k}", n, [3 * t, t, t], sync="ring",
                      comm_s_per_step=share * comm(n) * j, fp=fp, payload=64)
    res = build_report(find_runs([tmp_path / "runs"]), tmp_path / "rep", make_plots=False,
                       forecast_worlds=[8], gpus_per_node=4)
    (s,) = res["doc"]["forecast"]["series"]
    assert s["heldout"]["predicted_world"] == 4 and abs(s["heldout"]["rel_error"]) < 0.02, s["heldout"]
    (w8,) = [p for p in s["predictions"] if p["mode"] == "weak"]
    assert w8["core_share"] == 2.0 and w8["nodes"] == 2


@pytest.mark.parametrize("args, message", [
    (["--forecast", "8,x"], "error: --forecast 8,x: 'x' is not a world size"),
    (["--warmup", "-1"], "error: --warmup -1: give 0 or more epochs"),
    (["--gpus-per-node", "0"], "error: --gpus-per-node 0: give 1 or more"),
])
def test_bad_report_options_are_one_line(tmp_path, capsys, args, message):
    from ddp_lab.report.__main__ import main

    write_run(tmp_path / "runs", "r1", 1, [1.0])
    assert main([str(tmp_path / "runs"), "-o", str(tmp_path / "rep"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
    assert not (tmp_path / "rep").exists()


# the two link levels of a 2-node testbed: loopback inside a node, a 25 MB/s link between
# nodes, and the same link at a quarter of that rate (another allocation)
LOOPBACK, LINK, SLOW_LINK = (50e-6, 2e-9), (100e-6, 40e-9), (100e-6, 160e-9)


def ring_comm(n: int, level: tuple[float, float]) -> float:
    alpha, beta = level
    return 0.0 if n == 1 else 2 * (n - 1) * alpha + 2 * (n - 1) / n * PAYLOAD * beta


def write_bench(root: Path, name: str, nodes: int, level: tuple[float, float],
                fid: str = "aaaaaaaaaa") -> Path:
    """A bench run of 2 ranks (on `nodes` nodes) whose all_reduce times follow `level`."""
    d = root / name
    d.mkdir(parents=True)
    rows = [{"op": "all_reduce", "impl": "torch", "group": "global", "group_size": 2,
             "elements": e, "bytes": 4 * e, "correct": True,
             "time_median_s": 2 * level[0] + 4 * e * level[1],
             "busbw_GBps": 4 * e / (2 * level[0] + 4 * e * level[1]) / 1e9}
            for e in (2 ** 18, 2 ** 19, 2 ** 20)]
    (d / "bench.json").write_text(json.dumps({"meta": {}, "rows": rows}))
    (d / "summary.json").write_text(json.dumps({
        "kind": "bench", "status": "completed", "backend": "gloo", "device": "cpu",
        "nodes": nodes, "nproc_per_node": 2 // nodes, "world_size": 2,
        "fingerprint": FP, "fingerprint_id": fid}))
    return d


def test_forecast_prices_cross_node_traffic_with_the_links_fit(tmp_path):
    """Worlds 1 and 2 on one node (loopback), world 4 on 2 nodes x 2 across a slow link,
    a bench of each level: fitted on 1 and 2, world 4 comes out right only when the
    forecast prices it with the cross-node bench's fit (it spans 2 nodes, far fewer than
    --gpus-per-node's 8). A second allocation's world 4 (the link 4x slower, its own
    fingerprint and bench) is predicted from its own bench: the difference, predicted."""
    runs = tmp_path / "runs"
    for n, nodes, level in ((1, 1, LOOPBACK), (2, 1, LOOPBACK), (4, 2, LINK)):
        for k in range(2):
            t = STEPS * (C + ring_comm(n, level)) * (1 + 0.002 * (k - 0.5))
            write_run(runs, f"w{n}_r{k}", n, [3 * t, t, t], comm_s_per_step=ring_comm(n, level),
                      nodes=nodes)
    slow = STEPS * (C + ring_comm(4, SLOW_LINK))
    write_run(runs, "w4_slow", 4, [3 * slow, slow, slow], comm_s_per_step=ring_comm(4, SLOW_LINK),
              nodes=2, fid="bbbbbbbbbb")
    write_bench(runs, "bench_1x2", 1, LOOPBACK)
    write_bench(runs, "bench_2x1", 2, LINK)
    write_bench(runs, "bench_2x1_slow", 2, SLOW_LINK, fid="bbbbbbbbbb")
    res = build_report(find_runs([runs]), tmp_path / "rep", make_plots=False,
                       forecast_worlds=[8], gpus_per_node=8)
    (s,) = res["doc"]["forecast"]["series"]
    h = s["heldout"]
    assert h["predicted_world"] == 4 and abs(h["rel_error"]) < 0.02, h
    assert h["comm_fit"] == "bench: bench_1x2 (intra-node), bench: bench_2x1 (cross-node)"
    by_fid = {(f["world"], f["fingerprint_id"]): f for f in s["fit_check"]}
    fast, slow_check = by_fid[(4, "aaaaaaaaaa")], by_fid[(4, "bbbbbbbbbb")]
    assert slow_check["comm_fit"].endswith("bench: bench_2x1_slow (cross-node)")
    for f in s["fit_check"]:
        assert abs(f["rel_error"]) < 0.02, f
    assert slow_check["predicted_s"] / fast["predicted_s"] == pytest.approx(slow / fast["measured_s"],
                                                                         rel=0.02)
    assert "world 4 (fingerprint bbbbbbbbbb, comm: bench: bench_1x2 (intra-node), bench: " \
           "bench_2x1_slow (cross-node))" in res["markdown"]
    assert "world 4 (fingerprint aaaaaaaaaa) " in res["markdown"]  # the series' own comm fit
