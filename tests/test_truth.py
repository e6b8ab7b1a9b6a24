"""Measurement truth (issue 12 item 7): the per-collective alpha-beta fits, the model's
prediction with them, the bench lookup at a call's size, the per-step reading of a trace
(checked against hand-computed values), and `python -m ddp_lab.bench.suite truth` end to end on a tiny case
(real training and bench runs on gloo; no timed assertion: only that every figure exists)."""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from helpers import PY, REPO, child_env, describe

from ddp_lab.report.alpha_beta import Fit, cross_share, fit_all, phase_fit, predict_comm_s
from ddp_lab.report.truth_table import _ratios, bench_time, per_step


# Each call's time written by hand from the alpha-beta formulas (docs/collectives.md), for
# 4 ranks and float32 (m = 4 * elements bytes), never through costmodel.cost(), whose
# figures the fit is checked against: a model that priced elements instead of bytes, or
# miscounted a step, would fit its own numbers perfectly.
N_RANKS = 4
HAND = {  # (op, impl): (alpha steps, bytes on the path per byte of the buffer)
    ("all_reduce", "torch"): (2 * 3, 2 * 3 / 4),  # ring: 2(n-1) steps, 2(n-1)/n m
    ("all_reduce", "ring"): (2 * 3, 2 * 3 / 4),  # the same ring, ours
    ("reduce", "torch"): (4, 2 * 3 / 4),  # ring reduce-scatter (n-1) + gather (1); 2(n-1)/n m
    ("broadcast", "torch"): (2, 2),  # binomial tree: log2(n) steps of m each
}


def _rows(op, impl, alpha, beta, n, sizes=(1024, 8192, 65536, 524288, 4194304)):
    assert n == N_RANKS  # the hand formulas are for 4 ranks
    steps, per_byte = HAND[(op, impl)]
    return [{"op": op, "impl": impl, "group": "global", "group_size": n, "elements": s,
             "bytes": 4 * s, "correct": True,
             "time_median_s": steps * alpha + per_byte * (4 * s) * beta} for s in sizes]


# ------------------------------------------------------------------ the fits
def test_one_fit_per_collective_and_algorithm():
    n = N_RANKS
    truth = {("all_reduce", "torch"): (100e-6, 1e-9), ("all_reduce", "ring"): (400e-6, 2e-9),
             ("reduce", "torch"): (50e-6, 3e-9), ("broadcast", "torch"): (20e-6, 0.5e-9)}
    rows = [r for (op, impl), (a, b) in truth.items() for r in _rows(op, impl, a, b, n)]
    fits = fit_all(rows)
    assert set(fits) == set(truth)
    for key, (a, b) in truth.items():
        f = fits[key]
        assert (f.op, f.impl, f.n) == (key[0], key[1], n)
        assert math.isclose(f.alpha_s, a, rel_tol=1e-9) and math.isclose(f.beta_s_per_byte, b, rel_tol=1e-9)
    assert fits[("reduce", "torch")].algorithm == "ring reduce-scatter + gather"


def test_each_call_is_priced_with_its_own_fit():
    n, m = 4, 4_000_000  # bytes of one bucket (whole elements, a multiple of n)
    a_ar, b_ar, a_ring, b_ring = 100e-6, 1e-9, 400e-6, 2e-9
    a_red, b_red, a_bc, b_bc = 50e-6, 3e-9, 20e-6, 0.5e-9
    fits = {("all_reduce", "torch"): Fit(a_ar, b_ar, 5, "torch", "ring", "global", n, 0, "all_reduce"),
            ("all_reduce", "ring"): Fit(a_ring, b_ring, 5, "ring", "ring", "global", n, 0, "all_reduce"),
            ("reduce", "torch"): Fit(a_red, b_red, 5, "torch", "x", "global", n, 0, "reduce"),
            ("broadcast", "torch"): Fit(a_bc, b_bc, 5, "torch", "tree", "global", n, 0, "broadcast")}
    # by hand, from the formulas of costmodel.SYNC_FORMULAS: 2 buckets of m each
    ring = 2 * (2 * 3 * a_ring + 2 * 3 / 4 * m * b_ring)
    ddp = 2 * (2 * 3 * a_ar + 2 * 3 / 4 * m * b_ar)
    rb = 2 * (4 * a_red + 2 * 3 / 4 * m * b_red + 2 * (a_bc + m * b_bc))
    assert math.isclose(predict_comm_s("ring", n, 2 * m, 2, fits), ring)
    assert math.isclose(predict_comm_s("ddp", n, 2 * m, 2, fits), ddp)
    assert math.isclose(predict_comm_s("allreduce", n, 2 * m, 2, fits), ddp)
    assert math.isclose(predict_comm_s("reduce_broadcast", n, 4 * m, 4, fits), rb)
    # no tree fit: tree's steps and bytes, priced with the library all_reduce's alpha, beta
    assert phase_fit(fits, "all_reduce", "tree") is fits[("all_reduce", "torch")]
    assert math.isclose(predict_comm_s("tree", n, m, 1, fits), 2 * 2 * (a_ar + m * b_ar))
    # nothing to price with: no prediction rather than a wrong one
    assert predict_comm_s("ring", n, m, 1, {("reduce", "torch"): fits[("reduce", "torch")]}) is None


# ------------------------------------------------------------------ the bench lookup
def test_bench_time_exact_or_interpolated_log_log():
    rows = [{"op": "all_reduce", "impl": "torch", "group": "global", "group_size": 2,
             "elements": e, "time_median_s": t, "correct": True}
            for e, t in ((1000, 1e-3), (4000, 4e-3), (16000, 8e-3))]
    assert bench_time(rows, "all_reduce", "torch", 4000, 2) == (4e-3, True)
    t, exact = bench_time(rows, "all_reduce", "torch", 2000, 2)  # halfway in log size
    assert not exact and math.isclose(t, 2e-3)
    t, _ = bench_time(rows, "all_reduce", "torch", 8000, 2)  # sqrt(4e-3 * 8e-3)
    assert math.isclose(t, math.sqrt(32e-6))
    assert bench_time(rows, "all_reduce", "torch", 100, 2) is None  # outside: no guess
    assert bench_time(rows, "all_reduce", "torch", 4000, 4) is None  # another world
    assert bench_time(rows, "all_reduce", "ring", 4000, 2) is None


def test_bench_measures_the_explicit_sizes_too():
    from omegaconf import OmegaConf

    from ddp_lab.bench.harness import bench_sizes

    b = OmegaConf.create({"min_elements": 1024, "max_elements": 4096, "points": 2,
                          "sizes": [3000, 4096, 39760]})
    assert bench_sizes(b) == [1024, 3000, 4096, 39760]  # merged, each once, ascending
    b.sizes = []
    assert bench_sizes(b) == [1024, 4096]


# ------------------------------------------------------------------ the trace
def _ev(rank, step, ts_us, dur_us, payload=400, op="all_reduce"):
    return {"cat": "comm", "name": op, "pid": rank, "tid": 1000 + rank, "ph": "X",
            "ts": ts_us, "dur": dur_us, "args": {"step": step, "payload_bytes": payload}}


def test_per_step_union_and_the_last_arrival():
    events = [  # rank 0 arrives first and waits; two buckets overlap in step 0 (ddp-like)
        _ev(0, 0, 0, 500), _ev(0, 0, 300, 400, 800),  # union 0..700 = 700 µs
        _ev(1, 0, 200, 300), _ev(1, 0, 350, 340, 800),
        _ev(0, 1, 2000, 100), _ev(0, 1, 2200, 100, 800),  # union 200 µs
        _ev(1, 1, 2000, 150), _ev(1, 1, 2200, 50, 800),
        {"cat": "phase", "name": "backward", "pid": 0, "ts": 0, "dur": 9, "args": {"step": 0}}]
    st = per_step(events)
    assert st["steps"] == 2 and st["calls"] == [("all_reduce", 400), ("all_reduce", 800)]
    assert st["measured_s"] == pytest.approx([700e-6, 200e-6])
    # per call the shortest duration over ranks, ending where rank 0's ended, unioned:
    # step 0: [500-300, 500] and [700-340, 700] overlap -> 200..700; step 1: 100 + 50
    assert st["last_arrival_s"] == pytest.approx([500e-6, (100 + 50) * 1e-6])


# ------------------------------------------------------------------ across nodes
def test_steps_that_cross_nodes_cost_the_links_fit():
    """4 ranks, 2 to a node: a ring's every step has a message crossing (all at the link's
    pace); a tree's first level pairs ranks of one node, its second crosses: half its steps."""
    assert cross_share("all_reduce", "ring", 4, 2) == cross_share("all_reduce", "torch", 4, 2) == 1.0
    assert cross_share("all_reduce", "tree", 4, 2) == cross_share("all_reduce", "butterfly", 4, 2) == 0.5
    assert cross_share("all_reduce", "tree", 8, 2) == pytest.approx(2 / 3)
    assert cross_share("broadcast", "torch", 4, 1) == 1.0 and cross_share("all_reduce", "tree", 4, 4) == 0
    link = Fit(100e-6, 40e-9, 5, "torch", "ring", "global", 2, 0.0)  # 25 MB/s
    loopback = Fit(50e-6, 1e-9, 5, "torch", "ring", "global", 2, 0.0)
    m = 3_256_000
    tree = predict_comm_s("tree", 4, m, 1, link, per_node=2, intra=loopback)
    # reduce + broadcast: 2 levels each, one inside a node and one across
    assert tree == pytest.approx(2 * (link.alpha_s + m * link.beta_s_per_byte)
                                 + 2 * (loopback.alpha_s + m * loopback.beta_s_per_byte))
    assert predict_comm_s("tree", 4, m, 1, link) == pytest.approx(4 * (link.alpha_s + m * 40e-9))
    ring = predict_comm_s("ring", 4, m, 1, link, per_node=2, intra=loopback)
    assert ring == pytest.approx(predict_comm_s("ring", 4, m, 1, link))
    # a butterfly's crossing round: both ranks of a node send m across its one link at once
    butterfly = predict_comm_s("butterfly", 4, m, 1, link, per_node=2, intra=loopback)
    assert butterfly == pytest.approx(link.alpha_s + 2 * m * link.beta_s_per_byte
                                      + loopback.alpha_s + m * loopback.beta_s_per_byte)


# ------------------------------------------------------------------ why a row misses
def _row(measured, last, bench, model, calls=(("all_reduce", 3_256_000),), sync="ring", nodes=2,
         link=None, bench_min=None, per_call=()):
    return _ratios({"sync": sync, "nodes": nodes, "link": link, "calls": [list(c) for c in calls],
                    "measured_ms": measured, "last_arrival_ms": last, "bench_ms": bench,
                    "model_ms": model, "bench_min_ms": bench_min, "per_call": list(per_call)})


def test_why_names_the_known_reasons_of_a_miss():
    assert _row(100, 95, 100, 110)["why"] is None  # within both targets: nothing to explain
    # (a) missed, but after the last arrival the call is the bench's: rank 0 waited
    assert _row(150, 105, 100, 100)["why"].startswith(
        "waiting for a later rank (after the last arrival: 1.05 of the bench)")
    # (b) missed because the fit misses the bench itself
    assert _row(100, 100, 100, 60)["why"] == "the fit's line misses the bench here (bench / model 1.67)"
    # small calls across a shaped link: its tbf burst; not on one node, not for large calls
    tbf = {"iface": "eth0", "shaped_Bps": 25e6, "shaped_burst_B": 250000}
    small = (("all_reduce", 159_040),)
    assert _row(50, 50, 100, 100, small, link=tbf)["why"] == (
        "calls of 159 kB against the link's tbf burst of 250 kB (its idle time before a call "
        "sets the call's time)")
    assert _row(50, 50, 100, 100, small, link=tbf, nodes=1)["why"] == "not known"
    assert _row(50, 50, 100, 100, link=tbf)["why"] == "not known"
    two = (("all_reduce", 1_000_000), ("all_reduce", 2_256_000))
    assert _row(50, 50, 100, 100, two, sync="ddp")["why"] == "DDP's 2 buckets overlap backward and each other"
    # (a) missed against the bench's median, not its fastest iterations
    spread = _row(80, 80, 110, 85, bench_min=85)
    assert spread["why"] == "the bench's spread (its fastest iterations: 85 ms/step, measured / fastest 0.94)"
    # rank 0 roots reduce_broadcast's broadcast: its part ends early
    rb = _row(240, 120, 430, 400, (("reduce", 3_256_000), ("broadcast", 3_256_000)),
              sync="reduce_broadcast", per_call=[
                  {"op": "reduce", "measured_ms": 200, "bench_ms": 170},
                  {"op": "broadcast", "measured_ms": 22, "bench_ms": 265}])
    assert rb["why"] == ("rank 0 roots the broadcast: its sends end when handed to the kernel "
                         "(22 ms against the bench's 265)")


# ------------------------------------------------------------------ the script
@pytest.mark.parametrize("args, message", [
    (["--worlds", "2,x"], "error: --worlds 2,x: 'x' is not an integer of 2 or more"),
    (["--worlds", "1"], "error: --worlds 1: '1' is not an integer of 2 or more"),
    (["--syncs", "ring,fast"], "error: --syncs ring,fast: 'fast' is not one of ddp, allreduce"),
    (["--launcher", "mpi"], "error: --launcher mpi: give one of local, slurm"),
    (["--nodes", "2"], "error: --nodes 2: local runs are one node; add --launcher slurm"),
    (["--nodes", "0", "--launcher", "slurm"], "error: --nodes 0: '0' is not an integer of 1 or more"),
    (["--launcher", "slurm", "--nodes", "2", "--worlds", "2,3"],
     "error: --worlds 2,3: 3 ranks do not split over --nodes 2; give multiples of 2"),
    (["--set", "model.hidden"], "error: --set model.hidden: give KEY=VALUE"),
])
def test_comm_truth_bad_options_are_one_line(args, message, tmp_path, capsys):
    from ddp_lab.bench import suite

    assert suite.run("truth", [*args, "--dir", str(tmp_path / "o")]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(message) and err.count("\n") == 1 and not out, err
    assert not (tmp_path / "o").exists()


def test_comm_truth_bad_option_exits_2_from_the_shell():
    p = subprocess.run([PY, "-m", "ddp_lab.bench.suite", "truth", "--launcher", "mpi"], cwd=REPO, env=child_env(),
                       capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stderr) == (2, "error: --launcher mpi: give one of local, slurm\n"), describe(p)


def test_comm_truth_runs_on_slurm_nodes():
    from ddp_lab.bench import suite
    from ddp_lab.bench.specs import truth as ct

    args = suite.parse("truth", ["--launcher", "slurm", "--nodes", "2", "--worlds", "2,4",
                                 "--runs", "x", "--set", "model.hidden=[1024]"])
    assert args.worlds == [2, 4] and args.nodes == 2 and args.set == ["model.hidden=[1024]"]
    assert ct.launch(args, 4) == ["launcher=slurm", "launcher.nodes=2", "launcher.nproc_per_node=2",
                                  "launcher.wait=true"]
    assert ct.launch(suite.parse("truth", []), 4) == ["launcher.nproc_per_node=4"]


@pytest.mark.dist
@pytest.mark.slow
def test_comm_truth_script_end_to_end(tmp_path, shared_data_root):
    """Two real 2-rank training runs and their bench run; every row has its three figures."""
    out = tmp_path / "truth"
    p = subprocess.run(
        [PY, "-m", "ddp_lab.bench.suite", "truth", "--worlds", "2", "--models", "mlp",
         "--syncs", "allreduce,reduce_broadcast", "--steps", "8", "--bench-min", "1024",
         "--bench-max", "65536", "--bench-points", "2", "--data-root", str(shared_data_root),
         "--dir", str(out)], cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, describe(p)
    rows = json.loads((out / "truth.json").read_text())
    assert [(r["sync"], r["model"], r["world"]) for r in rows] == [
        ("allreduce", "mlp", 2), ("reduce_broadcast", "mlp", 2)]
    for r in rows:
        assert r["steps"] == 8 and r["measured_ms"] > 0 and r["last_arrival_ms"] > 0
        # the bench measured each bucket's exact size (bench.sizes), not a neighbour
        assert r["bench_exact"] is True and r["bench_ms"] > 0 and r["model_ms"] > 0
        # the cost model against the bench's own measurement at the calls' exact sizes, from
        # its fastest iterations to its median: within a factor of 2 of that spread. The (b)
        # target of 30% (docs/benchmarks.md: 0.79 to 1.16 on every row of an idle machine) is
        # the report's judgement (b_ok), not asserted here: on a loaded CI machine the fit's
        # own points slow too (1.32x the median, 1.88x the fastest in one run, with a right
        # model). A wrong cost is still out: bytes for elements 4x, reduce_broadcast's cost
        # doubled 2.27x the median of an idle run
        low, high = r["bench_min_ms"] / 2, r["bench_ms"] * 2
        assert low <= r["model_ms"] <= high, r
    ar, rb = rows
    assert ar["calls"] == [["all_reduce", 159040]]  # the notebook MLP's 39,760 float32
    assert rb["calls"] == [["reduce", 159040], ["broadcast", 159040]]
    assert set(rb["fits"]) == {"reduce/torch", "broadcast/torch"}
    assert "| allreduce | mlp | 2 | 1 |" in p.stdout and (out / "truth.md").exists()
