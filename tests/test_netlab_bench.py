"""Issue 22, item 2 ("the physical limit"): `python -m ddp_lab.bench` as a SLURM job on the
session's cluster, 2 nodes x 1 rank, across the lab's link shaped to 200 Mbit/s (25 MB/s)
for this test only: every byte of the all_reduce crosses the link. A large all_reduce's
busbw reaches the link's rate, for torch's all_reduce and for ddp_lab's own ring, and the
report's alpha-beta fit on that bench run finds the rate again in its bandwidth term
(1/beta). The figures are in docs/network.md ("The bench across the link")."""

from __future__ import annotations

import json

import pytest
from helpers import describe, run_cli, run_dir_of
from netlab_fixture import shaped

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.dist, pytest.mark.netlab]

TOLERANCE = 0.10
FIT_LOADED = 0.15
IMPLS = ("torch", "ring")
# 2^18 .. 2^21 float32 elements = 1 MB .. 8 MB: sizes the link paces, 4x its tbf burst
# (250 kB: what passes at full speed after an idle moment) and more; an 8 MB all_reduce of 2
# ranks sends 8 MB each way: 0.34 s at 25 MB/s. At 256 kB the burst made one torch run's
# median 5.6 ms instead of 10 (and its fit's 1/beta 1.24x the rate); from 4 kB up, calls
# took 0.3-6 ms, bimodal, and the fit's 1/beta came out 1.7x (docs/network.md). Few
# iterations: the largest sizes stop at min_iters.
BENCH = ["bench.ops=[all_reduce]", f"bench.impl=[{','.join(IMPLS)}]", "bench.groups=[global]",
         "bench.min_elements=262144", "bench.max_elements=2097152", "bench.points=4",
         "bench.warmup=1", "bench.iters=5", "bench.min_iters=3", "bench.time_per_size_s=0.5",
         "dist.device=cpu", "log.progress=lines"]
SLURM = ["launcher=slurm", "launcher.nodes=2", "launcher.nproc_per_node=1", "launcher.wait=true",
         "launcher.wait_timeout_s=300", "launcher.poll_s=1"]


def test_bench_reaches_the_link_rate_and_the_fit_finds_it(slurm_cluster, tmp_path):
    lab = slurm_cluster.lab_or_skip()
    with shaped(lab, "200mbit") as rate:
        assert rate == 25e6
        proc = run_cli(*BENCH, *SLURM, f"run.root={tmp_path / 'runs'}", cwd=tmp_path,
                       env=slurm_cluster.env, module="ddp_lab.bench", timeout=400)
    assert proc.returncode == 0, describe(proc)
    run_dir = run_dir_of(proc)
    doc = json.loads((run_dir / "bench.json").read_text())
    assert doc["meta"]["nodes"] == 2 and doc["meta"]["world_size"] == 2, doc["meta"]
    assert doc["topology"]["nodes"] == [[0], [1]] and not doc["topology"]["simulated"]
    rows = doc["rows"]
    assert all(r["correct"] and r["group_size"] == 2 for r in rows), rows

    # busbw of a 2-rank all_reduce = bytes / time (factor 2(n-1)/n = 1): each rank sends the
    # whole buffer once across its link (half in the reduce-scatter, half in the all-gather).
    # Timed by the fastest iteration of the two largest sizes (4 and 8 MB): the link caps how
    # fast a call can go (its tbf burst is 3% of 8 MB), and a loaded machine only ever slows
    # one (the ring reduces each piece on the CPU: under the suite's load an 8 MB median came
    # out at 0.87-0.89 of the link, 0.95-0.97 on an idle machine). The fastest call is the one
    # the CPU did not hold back, so it shows the link; the upper bound still catches a link
    # that was not shaped.
    largest = max(r["elements"] for r in rows)
    for impl in IMPLS:
        by_size = {r["elements"]: r for r in rows if r["impl"] == impl}
        assert set(by_size) == {2 ** k for k in range(18, 22)}, sorted(by_size)
        top = min((by_size[largest], by_size[largest // 2]),
                  key=lambda r: r["time_min_s"] / r["bytes"])
        busbw = top["bytes"] / top["time_min_s"]
        assert top["busbw_factor"] == 1 and top["algbw_GBps"] == top["busbw_GBps"], top
        print(f"{impl}: best busbw at 4-8 MB ({top['bytes'] / 1e6:.1f} MB) "
              f"{busbw / 1e6:.2f} MB/s = {busbw / rate:.3f} of the link's {rate / 1e6:.0f} MB/s "
              f"(fastest {top['time_min_s'] * 1e3:.0f} ms, median {top['time_median_s'] * 1e3:.0f} ms "
              f"of {top['iters']}); at 2^20, median: "
              f"{by_size[largest // 2]['busbw_GBps'] * 1e9 / rate:.3f}")
        assert abs(busbw / rate - 1) <= TOLERANCE, (impl, busbw, top)

    # the report on that run folder: its alpha-beta fit per implementation, 1/beta = the link
    report = tmp_path / "report"
    res = run_cli(str(run_dir), "-o", str(report), "--no-plots", cwd=tmp_path,
                  module="ddp_lab.report", timeout=120)
    assert res.returncode == 0, describe(res)
    fits = json.loads((report / "report.json").read_text())["fits"]
    assert [f["run"] for f in fits] == [str(run_dir)], fits
    by_impl = {f["impl"]: f for f in fits[0]["all"] if f["group"] == "global"}
    assert set(by_impl) == set(IMPLS), fits
    for impl in IMPLS:
        fit = by_impl[impl]
        bandwidth = fit["bandwidth_GBps"] * 1e9
        print(f"{impl} fit: alpha {fit['alpha_us']:.0f} us, 1/beta {bandwidth / 1e6:.2f} MB/s = "
              f"{bandwidth / rate:.3f} of the link, rel. RMS {fit['rel_rms']:.0%} "
              f"({fit['points']} points)")
        # the fit reads each size's median, which a loaded machine holds back (the ring
        # reduces on the CPU: 0.897 of the link under the suite's 4 workers, 0.95-0.97 idle):
        # the load can only slow it, so below by FIT_LOADED, above by TOLERANCE (which still
        # catches a link that was not shaped)
        assert -FIT_LOADED <= bandwidth / rate - 1 <= TOLERANCE, (impl, fit)
