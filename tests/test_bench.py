"""ddp_lab.bench: sizes, topology groups, checks, and real sweeps through the CLI.

The CLI tests run `python -m ddp_lab.bench` as a user does (torchrun, gloo, 2 and 3
ranks, sizes 2^10..2^14) and read back every file the run folder should hold.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from helpers import compose, run_cli, run_dir_of, run_world

from ddp_lab.bench.config import BenchConfig, register_bench_configs
from ddp_lab.bench.harness import log_sizes
from ddp_lab.predict.costmodel import pow2_label
from ddp_lab.bench.ops import OPS
from ddp_lab.bench.ops import Pattern
from ddp_lab.world.topology import topology_from_table
from ddp_lab.predict.costmodel import busbw_factor
from ddp_lab.config.errors import UserError

register_bench_configs()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ pure functions
def test_default_sweep_is_log_spaced_powers_of_two():
    cfg = compose(config_name="bench")
    sizes = log_sizes(cfg.bench.min_elements, cfg.bench.max_elements, cfg.bench.points)
    assert sizes == [2 ** k for k in range(10, 27, 2)] and len(sizes) >= 8
    assert cfg.run.entry == "ddp_lab.bench.worker" and cfg.bench.ops == ["all_reduce"]


def test_handin_preset_spans_2_10_to_2_32_over_three_groups():
    cfg = compose("bench=handin", config_name="bench")
    sizes = log_sizes(cfg.bench.min_elements, cfg.bench.max_elements, cfg.bench.points)
    assert sizes[0] == 2 ** 10 and sizes[-1] == 2 ** 32 and len(sizes) >= 8
    assert all(s & (s - 1) == 0 for s in sizes)
    assert list(cfg.bench.groups) == ["global", "intra_node", "cross_node"]
    assert OmegaConf.get_type(cfg.bench) is BenchConfig


@pytest.mark.parametrize("overrides, refused", [
    ([], True), (["launcher.gpus_per_node=4"], False), (["dist.device=cpu"], False),
    (["cluster=alps", "launcher.account=a", "launcher.environment=e.toml"], False)])
def test_handin_on_slurm_asks_for_the_gpus(overrides, refused):
    """bench=handin measures NCCL between GPUs: on SLURM without a GPU request it would
    fall back to gloo on CPUs (dist.device=auto), so it is refused unless asked for."""
    from ddp_lab.bench.submit import resolve_bench

    cfg = compose("bench=handin", "launcher=slurm", *overrides, config_name="bench")
    if refused:
        with pytest.raises(UserError, match="set launcher.gpus_per_node"):
            resolve_bench(cfg)
    else:
        assert resolve_bench(cfg).bench.plot_metric == "throughput"


def test_log_sizes_edge_cases():
    assert log_sizes(1024, 1024, 5) == [1024]
    assert log_sizes(1000, 3000, 1) == [3000]
    s = log_sizes(1000, 1_000_000, 7)
    assert s[0] == 1000 and s[-1] == 1_000_000 and s == sorted(set(s))
    assert pow2_label(4096) == "2^12" and pow2_label(4095) == "4095"


def test_groups_of_four_nodes_of_four():
    topo = topology_from_table([r // 4 for r in range(16)], ["h"] * 16)
    assert topo.groups("global") == [tuple(range(16))]
    assert topo.groups("intra_node") == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
    assert topo.groups("cross_node") == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)]
    assert topo.pairs() == {"same_node": (0, 1), "cross_node": (0, 4)}


def test_groups_follow_the_reported_nodes_not_rank_order():
    # a launcher that places ranks round-robin: node of rank r is r % 2
    topo = topology_from_table([0, 1, 0, 1, 0], ["a", "b", "a", "b", "a"])
    assert topo.groups("intra_node") == [(0, 2, 4), (1, 3)]
    assert topo.groups("cross_node") == [(0, 1), (2, 3), (4,)]
    one = topology_from_table([0, 0, 0], ["a"] * 3)
    assert one.groups("cross_node") == [(0,), (1,), (2,)]
    assert one.pairs()["cross_node"] is None


def test_busbw_factors_are_nccl_tests():
    assert busbw_factor("all_reduce", 4) == 1.5
    assert busbw_factor("all_gather", 4) == busbw_factor("reduce_scatter", 4) == 0.75
    assert busbw_factor("gather", 4) == 0.75  # nccl-tests' gather: (n-1)/n of the full array
    for op in ("broadcast", "reduce", "send_recv"):
        assert busbw_factor(op, 4) == 1.0
    assert {OPS[o].factor for o in OPS} <= {"all_reduce", "all_gather", "reduce_scatter",
                                           "gather", "broadcast", "reduce", "send_recv"}
    assert OPS["reduce_broadcast"].factor == "reduce"  # factor 1: bytes = the tensor


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bfloat16])
def test_pattern_catches_a_misplaced_element(dtype):
    pat = Pattern(dtype, torch.device("cpu"))
    t = torch.empty(1000, dtype=dtype)
    pat.fill(t, base=3, scale=2, off=5)
    assert pat.check(t, base=3, scale=2, off=5) is None
    t[[10, 11]] = t[[11, 10]]  # a swap keeps every sum, only the position is wrong
    err = pat.check(t, base=3, scale=2, off=5)
    assert err is not None and "result[10]" in err


# ------------------------------------------------------------- in-process worlds
def _bench_cfg(**kw):
    cfg = OmegaConf.structured(BenchConfig)
    for k, v in kw.items():
        cfg[k] = v
    return cfg


def _broken_world(rank, world, out_dir):
    """A sweep with a deliberately wrong implementation and a simulated 2-node layout."""
    import torch.distributed as dist

    from ddp_lab.bench.harness import memory_caps, run_bench
    from ddp_lab.bench.output import write_outputs
    from ddp_lab.world.distributed import DistContext
    from ddp_lab.world.env import detect_env

    def broken(b, g):
        dist.all_reduce(b["t"], group=g.handle)
        if g.grank == 0:
            b["t"][7] += 1  # one element off, on one rank

    OPS["all_reduce"].impls["broken"] = broken
    ctx = DistContext(env=detect_env(), backend="gloo", device=torch.device("cpu"))
    cfg = _bench_cfg(ops=["all_reduce", "ping_pong"], impl=["torch", "broken"],
                     groups=["global", "intra_node", "cross_node"], min_elements=1024,
                     max_elements=4096, points=2, warmup=1, iters=2, min_iters=2, node_size=2)
    result = run_bench(cfg, ctx, "lines")
    caps, note = memory_caps(_bench_cfg(memory_fraction=1e-9), ctx, 4)
    if rank == 0:
        meta = {"allocation": "test", "hosts": ["h"], "torch": "x", "dtype": "float32",
                "warmup": 1, "iters": 2, "min_iters": 2, "command": "test"}
        write_outputs(Path(out_dir), result, meta)
    return {"result": result if rank == 0 else None, "caps": caps, "note": note}


@pytest.mark.dist
def test_wrong_results_are_reported_not_plotted_and_groups_follow_topology(tmp_path):
    out = run_world(_broken_world, 3, str(tmp_path))
    result = out[0]["result"]
    topo = result["topology"]
    assert topo["nodes"] == [[0, 1], [2]] and topo["simulated"]
    assert topo["groups"]["cross_node"] == [[0, 2], [1]]
    rows = result["rows"]
    broken = [r for r in rows if r["impl"] == "broken"]
    good = [r for r in rows if r["impl"] == "torch"]
    assert broken and all(not r["correct"] and "rank 0" in r["error"] for r in broken)
    assert good and all(r["correct"] for r in good)
    # the intra-node kind: only node 0 has two ranks; the 1-rank node waits at the barrier
    intra = [r for r in good if r["op"] == "all_reduce" and r["group"] == "intra_node"]
    assert {r["group_size"] for r in intra} == {2} and {tuple(r["ranks"]) for r in intra} == {(0, 1)}
    pings = {r["group"]: r for r in good if r["op"] == "ping_pong"}
    assert set(pings) == {"same_node", "cross_node"} and pings["cross_node"]["ranks"] == [0, 2]
    assert any("ping_pong: no broken implementation" in n for n in result["notes"])
    # not plotted, but in the tables
    drawn = json.loads((tmp_path / "plots" / "all_reduce.json").read_text())
    assert drawn["series"] and not any("broken" in s for s in drawn["series"])
    md = (tmp_path / "bench.md").read_text()
    assert "WRONG RESULT" in md and "**WRONG**" in md
    # a tiny memory budget caps every op below the smallest size
    assert all(c["caps"]["all_reduce"] == 0 for c in out)
    assert "per rank (bench.memory_fraction=1e-09 of the available RAM" in out[0]["note"]


# --------------------------------------------------------------------- the CLI
def _check_run_folder(run_dir: Path, world: int) -> list[dict]:
    return _check_run_folder_launcher(run_dir, world, "local")


def _check_run_folder_launcher(run_dir: Path, world: int, launcher: str) -> list[dict]:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["kind"] == "bench" and summary["status"] == "completed", summary
    assert summary["world_size"] == world and summary["launcher"] == launcher
    doc = json.loads((run_dir / "bench.json").read_text())
    rows = doc["rows"]
    assert rows and summary["measurements"] == len(rows)
    with open(run_dir / "bench.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    for r in rows:
        assert r["correct"], r
        n = r["group_size"]
        # nccl-tests' definitions, exactly
        assert r["busbw_factor"] == busbw_factor(OPS[r["op"]].factor, n)
        assert r["busbw_GBps"] == r["algbw_GBps"] * r["busbw_factor"]
        assert math.isclose(r["algbw_GBps"], r["bytes"] / r["time_median_s"] / 1e9, rel_tol=1e-12)
        assert r["bytes"] == r["elements"] * 4
        assert r["time_min_s"] <= r["time_p25_s"] <= r["time_median_s"] <= r["time_p75_s"] <= r["time_max_s"]
        assert r["iters"] >= 1
    md = (run_dir / "bench.md").read_text()
    assert "GB/s = 1e9 bytes/s" in md and "| op | impl | group |" in md
    assert "python -m ddp_lab.bench" in md  # the command that made it
    for plot in doc["plots"]:
        png = run_dir / "plots" / plot["file"]
        data = png.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000
        side = json.loads(png.with_suffix(".json").read_text())
        assert side["series"] == plot["series"] and side["series"]
    return rows


@pytest.mark.slow
@pytest.mark.dist
def test_cli_two_ranks_ours_vs_the_library(tmp_path):
    proc = run_cli("launcher.nproc_per_node=2", "bench.max_elements=16384", "bench.points=3",
                   "bench.impl=[torch,ring,butterfly]", "bench.warmup=1", "bench.iters=3",
                   "log.progress=lines", f"run.root={tmp_path}", cwd=tmp_path,
                   module="ddp_lab.bench", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = run_dir_of(proc)
    assert run_dir.name.startswith("bench_local_")
    assert "-m ddp_lab.bench.worker" in (run_dir / "launch.sh").read_text()
    rows = _check_run_folder(run_dir, 2)
    assert {(r["impl"], r["elements"]) for r in rows} == {
        (i, s) for i in ("torch", "ring", "butterfly") for s in (2 ** 10, 2 ** 12, 2 ** 14)}
    side = json.loads((run_dir / "plots" / "all_reduce.json").read_text())
    assert side["series"] == ["torch · global (n=2)", "ring · global (n=2)", "butterfly · global (n=2)"]
    assert side["metric"] == "busbw"
    assert "| all_reduce | butterfly | global | 2 |" in proc.stdout  # the peak table


@pytest.mark.dist
@pytest.mark.slow
def test_cli_three_ranks_every_op_impl_and_group(tmp_path):
    ops = "[all_reduce,reduce,broadcast,reduce_broadcast,send_recv_ring,isend_irecv_ring,all_gather,gather,reduce_scatter,ping_pong]"
    proc = run_cli("launcher.nproc_per_node=3", "bench.max_elements=4096", "bench.points=2",
                   f"bench.ops={ops}", "bench.impl=[torch,ring,butterfly,tree,linear]",
                   "bench.groups=[global,intra_node,cross_node]", "bench.warmup=1",
                   "bench.iters=2", "bench.min_iters=1", "log.progress=lines",
                   f"run.root={tmp_path}", cwd=tmp_path, module="ddp_lab.bench", timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = run_dir_of(proc)
    rows = _check_run_folder(run_dir, 3)
    doc = json.loads((run_dir / "bench.json").read_text())
    # one node: intra_node is the whole world, cross_node groups have 1 rank -> skipped
    assert {r["group"] for r in rows if r["op"] != "ping_pong"} == {"global", "intra_node"}
    assert any("cross_node: every cross_node group has 1 rank" in n for n in doc["notes"])
    assert any("ping_pong/cross_node: no such pair" in n for n in doc["notes"])
    got = {(r["op"], r["impl"]) for r in rows}
    for op, spec in OPS.items():
        assert {(op, i) for i in spec.impls} <= got, op
    ag = [r for r in rows if r["op"] == "all_gather"]
    assert {r["elements"] for r in ag} == {1023, 4095}  # n pieces of N // n: the full array
    assert {p["file"] for p in doc["plots"]} == {f"{op}.png" for op in OPS} | {"overview.png"}
    side = json.loads((run_dir / "plots" / "reduce_broadcast.json").read_text())
    assert set(side["series"]) == {f"{i} · {g} (n=3)" for i in ("torch", "tree", "linear")
                                   for g in ("global", "intra_node")}


def test_cli_dry_run_renders_the_bench_worker(tmp_path):
    proc = run_cli("launcher.dry_run=true", "launcher.nproc_per_node=4", f"run.root={tmp_path}",
                   cwd=tmp_path, module="ddp_lab.bench")
    assert proc.returncode == 0, proc.stderr
    run_dir = run_dir_of(proc)
    script = (run_dir / "launch.sh").read_text()
    assert "-m ddp_lab.bench.worker" in script and "--nproc_per_node=\"$NPROC_PER_NODE\"" in script
    assert "NPROC_PER_NODE:-4" in script
    assert OmegaConf.load(run_dir / "config.yaml").run.entry == "ddp_lab.bench.worker"
    # the trainer keeps its own worker
    proc = run_cli("launcher.dry_run=true", f"run.root={tmp_path}", cwd=tmp_path)
    assert "-m ddp_lab.worker" in (run_dir_of(proc) / "launch.sh").read_text()


@pytest.mark.parametrize("launcher,script", [
    (["launcher=mpirun", "launcher.hosts=[localhost:2]"], "mpi_rank.sh"),
    (["launcher=slurm", "launcher.nodes=2"], "job.sbatch"),
    (["launcher=slurm", "launcher.nodes=2", "launcher.per_task=true"], "job.sbatch"),
    (["launcher=runai", "launcher.nodes=2", "launcher.image=img", "launcher.project=p"], "pod.sh"),
])
def test_every_launcher_renders_the_bench_worker(tmp_path, launcher, script):
    proc = run_cli(*launcher, "launcher.dry_run=true", f"run.root={tmp_path}", cwd=tmp_path,
                   module="ddp_lab.bench")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (run_dir_of(proc) / script).read_text()
    assert "-m ddp_lab.bench.worker" in text and "ddp_lab.worker" not in text


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.dist
def test_mpirun_runs_the_bench(tmp_path):
    import shutil

    if shutil.which("mpirun") is None:
        pytest.skip("mpirun is not installed")
    proc = run_cli("launcher=mpirun", "launcher.hosts=[localhost:2]", "launcher.allow_run_as_root=true",
                   "bench.ops=[all_reduce,ping_pong]", "bench.max_elements=4096", "bench.points=2",
                   "bench.warmup=1", "bench.iters=2", "bench.min_iters=1", "log.progress=lines", f"run.root={tmp_path}",
                   cwd=tmp_path, module="ddp_lab.bench", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _check_run_folder_launcher(run_dir_of(proc), 2, "mpirun")
    assert {(r["op"], r["group"]) for r in rows} == {("all_reduce", "global"), ("ping_pong", "same_node")}


@pytest.mark.parametrize("override,message", [
    ("bench.ops=[all_reduce,allreduce]", "bench.ops: unknown allreduce"),
    ("bench.impl=[butterfly]", "bench.impl=butterfly: none of bench.ops=['reduce']"),
    ("bench.groups=[intra]", "bench.groups: unknown intra"),
    ("bench.min_elements=4096", "bench.max_elements=1024 is below"),
])
def test_cli_bad_input_is_one_line_no_traceback(tmp_path, override, message):
    extra = ["bench.ops=[reduce]"] if "butterfly" in override else []
    extra += ["bench.max_elements=1024"] if "min_elements" in override else []
    proc = run_cli(override, *extra, f"run.root={tmp_path}", cwd=tmp_path, module="ddp_lab.bench")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.iterdir())  # nothing was made


def test_cli_misspelt_key_fails_at_composition(tmp_path):
    proc = run_cli("bench.op=[all_reduce]", f"run.root={tmp_path}", cwd=tmp_path,
                   module="ddp_lab.bench")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "op" in proc.stderr


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.dist
def test_handin_on_two_slurm_nodes_takes_the_groups_from_the_launcher(slurm_cluster, tmp_path):
    """The loopback SLURM cluster: 2 nodes x 2 ranks, node ranks from torchrun under srun."""
    proc = run_cli("bench=handin", "launcher=slurm", "launcher.nodes=2", "launcher.nproc_per_node=2",
                   "dist.device=cpu", "launcher.wait=true", "launcher.wait_timeout_s=300", "launcher.poll_s=1",
                   "bench.ops=[all_reduce,ping_pong]", "bench.max_elements=16384", "bench.points=2",
                   "bench.warmup=1", "bench.iters=2", "bench.min_iters=2", "log.progress=lines",
                   f"run.root={tmp_path}", cwd=tmp_path, env=slurm_cluster.env,
                   module="ddp_lab.bench", timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    run_dir = run_dir_of(proc)
    assert "-m ddp_lab.bench.worker" in (run_dir / "job.sbatch").read_text()
    rows = _check_run_folder_launcher(run_dir, 4, "slurm")
    doc = json.loads((run_dir / "bench.json").read_text())
    topo = doc["topology"]
    assert topo["nodes"] == [[0, 1], [2, 3]] and not topo["simulated"]
    assert topo["groups"]["intra_node"] == [[0, 1], [2, 3]]
    assert topo["groups"]["cross_node"] == [[0, 2], [1, 3]]
    assert {(r["op"], r["group"]) for r in rows} == {
        ("all_reduce", "global"), ("all_reduce", "intra_node"), ("all_reduce", "cross_node"),
        ("ping_pong", "same_node"), ("ping_pong", "cross_node")}
    assert {r["group_size"] for r in rows if r["group"] in ("intra_node", "cross_node")} == {2}
    pings = {r["group"]: r["ranks"] for r in rows if r["op"] == "ping_pong"}
    assert pings == {"same_node": [0, 1], "cross_node": [0, 2]}
    side = json.loads((run_dir / "plots" / "all_reduce.json").read_text())
    assert side["series"] == ["torch · global (n=4)", "torch · intra_node (n=2 x2)",
                              "torch · cross_node (n=2 x2)"]
    # the assignment's figure: bytes / time in GiB/s, on the plot's axis and in the CSV
    assert side["metric"] == "throughput" and "GiB/s" in side["ylabel"]
    with open(run_dir / "bench.csv") as f:
        for r in csv.DictReader(f):
            want = int(r["bytes"]) / float(r["time_median_s"]) / 2**30
            assert float(r["throughput_GiBps"]) == pytest.approx(want, rel=1e-9)


def test_reduce_broadcast_checks_the_assignments_expected_param():
    """The assignment's root update at 4 ranks: parameters 1, gradient = rank, lr 0.1 ->
    expected_param = 1 - 0.1 * (4 - 1) / 2 = 0.85 at element 0 (the pattern adds to the
    others); the reduce is done by hand here, the op's own update and check run as is."""
    from ddp_lab.bench.ops import LR
    from ddp_lab.bench.ops import GroupCtx

    op, n, size = OPS["reduce_broadcast"], 4, 64
    pat = Pattern(torch.float32, torch.device("cpu"))
    bufs = []
    for r in range(n):
        g = GroupCtx(tuple(range(n)), None, r)
        b = op.setup(size, g, torch.float32, torch.device("cpu"))
        op.reset(b, g, pat)
        bufs.append(b)
    assert [float(b["grad"][0]) for b in bufs] == [0.0, 1.0, 2.0, 3.0]
    root = GroupCtx(tuple(range(n)), None, 0)
    bufs[0]["grad"] = sum(b["grad"] for b in bufs)  # the reduce, to rank 0
    from ddp_lab.bench.ops import _rb_update
    _rb_update(bufs[0], root)
    assert LR == 0.1 and float(bufs[0]["param"][0]) == pytest.approx(1 - 0.1 * (n - 1) / 2) == 0.85
    assert op.check(bufs[0], root, pat) is None
    bufs[0]["param"][5] += 1e-3  # a wrong element is caught
    assert "param[5]" in op.check(bufs[0], root, pat)
