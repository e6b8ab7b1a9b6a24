"""sync.overlap=true and exposed vs in-flight comm, on real gloo process groups.

Equivalence: every overlapped synchroniser (allreduce, ring, tree, butterfly,
reduce_broadcast) trains STEPS steps of an MLP with buckets small enough to give several,
from the same weights on rank-disjoint batches, and must end with DDP's weights (within
1e-6), at 2 and 3 ranks; the same with two micro-batches per step (no_sync). Negative
control: an overlapped sync whose last bucket is never waited for must fail the check.

Exposed vs in-flight: on mlp_wide (10M parameters, backward long enough to hide buckets
behind) DDP's and each overlapped sync's exposed comm is below its in-flight comm, while
the blocking allreduce's exposed comm is (nearly) all of it.
"""

from __future__ import annotations

import itertools
import json
import os

import pytest
import torch
import torch.nn.functional as F

from ddp_lab.models import MLP
from ddp_lab.config import check_sync
from ddp_lab.sync import build_sync, sync_class
from ddp_lab.sync.allreduce import OverlappedAllReduce
from ddp_lab.timing import Clock, StepTimer, epoch_timing
from ddp_lab.rank.epochs import EpochBatches
from ddp_lab.step import run_steps

from helpers import run_cli, run_dir_of, run_world, tensorboard
from test_sync import sync_cfg

STEPS, BATCH, HIDDEN, LR, MOMENTUM = 30, 8, [32, 16], 0.1, 0.9
SMALL_MB = 0.001  # 1000 bytes: 4 buckets of the 784-32-16-10 MLP (fc1.weight alone)
TOL = 1e-6
OVERLAPPED = ["allreduce", "ring", "tree", "butterfly", "reduce_broadcast"]


class ForgetsLastBucket(OverlappedAllReduce):
    """Broken: sync() unpacks before the overlap thread has finished the last bucket."""

    def sync(self):
        self.ready.finish()
        futures = self.worker.futures
        for f in futures[:-1]:
            f.result()
        for b in self.buckets[:-1]:
            b.unpack_grads()
        futures[-1].result()  # (drained, so the next step starts clean) but never unpacked
        self.worker.futures = []


def batches(world: int):
    g = torch.Generator().manual_seed(7)
    return (torch.randn(STEPS, world * BATCH, 784, generator=g),
            torch.randint(0, 10, (STEPS, world * BATCH), generator=g))


def _train(rank, world, syncer, model, micro: int) -> list:
    xs, ys = batches(world)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    syncer.preflight(lambda m=model: F.cross_entropy(m(xs[0, :2]), ys[0, :2]))
    for k in range(STEPS):
        x, y = xs[k, rank * BATCH:(rank + 1) * BATCH], ys[k, rank * BATCH:(rank + 1) * BATCH]
        opt.zero_grad(set_to_none=True)
        parts = list(zip(x.split(BATCH // micro), y.split(BATCH // micro)))
        for i, (xm, ym) in enumerate(parts):
            ctx = syncer.no_sync() if i < len(parts) - 1 else torch.enable_grad()
            with ctx:
                (F.cross_entropy(syncer.wrapped(xm), ym) / len(parts)).backward()
        syncer.sync()
        syncer.step(opt)
    comm = syncer.collect_comm()
    syncer.close()
    return [p.detach().numpy().copy() for p in model.parameters()], comm.calls


def _equivalence_worker(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    out = {}
    runs = [("ddp", "ddp", {"bucket_cap_mb": SMALL_MB}, None)]
    runs += [(n, n, {"bucket_mb": SMALL_MB, "overlap": True}, None) for n in OVERLAPPED]
    runs += [("broken", "allreduce", {"bucket_mb": SMALL_MB, "overlap": True}, ForgetsLastBucket)]
    for micro in (1, 2):
        for variant, name, overrides, cls in runs:
            torch.manual_seed(0)
            model = MLP(hidden=HIDDEN)
            cfg = sync_cfg(name, **overrides)
            syncer = (cls or sync_class(name, overlap=True))(cfg, model, torch.device("cpu"), world)
            params, calls = _train(rank, world, syncer, model, micro)
            buckets = len(getattr(syncer, "buckets", getattr(syncer, "grad_buckets", [])))
            out[(variant, micro)] = {"params": params, "calls": calls, "buckets": buckets}
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"world{w}")
def overlap_run(request):
    return request.param, run_world(_equivalence_worker, request.param, timeout=240)


def _max_diff(a, b) -> float:
    return max(float(abs(x - y).max()) for x, y in zip(a, b))


@pytest.mark.dist
@pytest.mark.parametrize("micro", [1, 2], ids=["whole", "micro2"])
@pytest.mark.parametrize("name", OVERLAPPED)
def test_overlapped_sync_matches_ddp(overlap_run, name, micro):
    world, results = overlap_run
    ddp = results[0][("ddp", micro)]["params"]
    for rank, r in enumerate(results):
        rec = r[(name, micro)]
        assert rec["buckets"] >= 3, f"{name}: want several buckets, got {rec['buckets']}"
        diff = _max_diff(rec["params"], ddp)
        assert diff <= TOL, f"{name} micro={micro} world {world} rank {rank}: {diff:.3g} from ddp"


@pytest.mark.dist
def test_overlap_calls_one_collective_per_bucket_and_step(overlap_run):
    """no_sync held the hooks back: micro-batching does not add calls."""
    _, results = overlap_run
    for name in OVERLAPPED:
        rec = results[0][(name, 2)]
        per_step = 2 * rec["buckets"] if name == "reduce_broadcast" else rec["buckets"]
        # reduce_broadcast: one reduce per gradient bucket, one broadcast per parameter bucket
        assert rec["calls"] == results[0][(name, 1)]["calls"] == per_step * STEPS, name


@pytest.mark.dist
def test_a_sync_that_forgets_a_bucket_fails_the_check(overlap_run):
    world, results = overlap_run
    ddp = results[0][("ddp", 1)]["params"]
    assert _max_diff(results[0][("broken", 1)]["params"], ddp) > 1e-3


# ------------------------------------------------------------ exposed vs in-flight
def test_exposed_is_the_in_flight_union_after_compute_end():
    from ddp_lab.timing import CommCall, CommStats, StepTimes

    def step(t0, compute_end):
        return StepTimes([("forward", t0, t0 + 1), ("backward", t0 + 1, t0 + 4),
                          ("sync", t0 + 4, t0 + 6), ("optim", t0 + 6, t0 + 7)], compute_end)

    # step 1: buckets at [2, 3.5] and [3, 5] (overlapping), compute end 3.8 -> exposed 1.2
    # step 2: no mark (backward end 14 counts), a call at [14, 15.5] -> exposed 1.5
    steps = [step(0, 3.8), step(10, None)]
    calls = [CommCall("all_reduce", 1, 1, 1, 2, 3.5), CommCall("all_reduce", 1, 1, 1, 3, 5),
             CommCall("all_reduce", 1, 1, 1, 14, 15.5)]
    comm = CommStats(calls=3, timed=calls, seconds=3 + 1.5)
    assert comm.per_step_seconds(steps) == [3.0, 1.5]
    assert comm.per_step_exposed(steps) == pytest.approx([1.2, 1.5])
    assert [s.compute_seconds() for s in steps] == pytest.approx([1 + 2.8, 1 + 3])
    t = epoch_timing(steps, comm)
    assert t["exposed_s"] == pytest.approx(2.7) and t["compute_s"] == pytest.approx(7.8)
    assert t["exposed_fraction"] == pytest.approx(2.7 / 14)
    assert t["comm_fraction"] == pytest.approx(4.5 / 14)


def test_grad_ready_mark_stamps_the_last_gradient_of_each_step():
    clock = Clock(torch.device("cpu"))
    timer = StepTimer(clock)
    model = MLP(hidden=[8])
    seen: list[list[float]] = []
    for p in model.parameters():  # registered first: each runs just before the mark's hook
        p.register_post_accumulate_grad_hook(lambda p: seen[-1].append(clock.stamp()))
    timer.watch_grads(model)
    for _ in range(2):
        seen.append([])
        with timer.phase("backward"):
            F.cross_entropy(model(torch.randn(4, 784)), torch.tensor([0, 1, 2, 3])).backward()
        timer.end_step()
    with timer.phase("forward"):  # a step without backward has no mark
        pass
    timer.end_step()
    steps = timer.collect()
    assert [s.compute_end is None for s in steps] == [False, False, True]
    for s, stamps in zip(steps, seen):  # after every gradient of its step, before its end
        assert len(stamps) == 4
        assert s.spans[0][1] < max(clock.seconds(t) for t in stamps) <= s.compute_end <= s.spans[-1][2]
    timer.grads.remove()


def _exposed_worker(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    from ddp_lab.models import build_model
    from omegaconf import OmegaConf

    out = {}
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g)
    for variant, name, overrides in [("ddp", "ddp", {"bucket_cap_mb": 4}),
                                     ("allreduce", "allreduce", {"bucket_mb": 4}),
                                     *[(f"{n}+overlap", n, {"bucket_mb": 4, "overlap": True})
                                       for n in ("allreduce", "ring", "reduce_broadcast")]]:
        torch.manual_seed(0)
        model = build_model(OmegaConf.create({"name": "mlp_wide", "hidden": [2048] * 3}))
        clock = Clock(torch.device("cpu"))
        syncer = build_sync(sync_cfg(name, **overrides), model, torch.device("cpu"), world,
                            clock=clock)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        timer = StepTimer(clock)
        timer.watch_grads(model)
        run_steps(syncer, opt, EpochBatches(itertools.repeat((x, y)), range(4), timer),
                  timer)  # the trainer's step
        steps, comm = timer.collect(), syncer.collect_comm()
        t = epoch_timing(steps, comm)
        out[variant] = {"inflight": comm.seconds, "exposed": t["exposed_s"],
                        "compute": t["compute_s"], "marks": [s.compute_end for s in steps],
                        "bwd_ends": [max(e for n, _, e in s.spans if n == "backward") for s in steps]}
        syncer.close()
        timer.grads.remove()
    return out


@pytest.mark.slow
@pytest.mark.dist
def test_exposed_comm_is_below_in_flight_when_overlapped():
    results = run_world(_exposed_worker, 2, timeout=240)
    for rank, r in enumerate(results):
        for variant, rec in r.items():
            assert all(m is not None and m <= e for m, e in zip(rec["marks"], rec["bwd_ends"]))
            assert rec["compute"] > 0 and 0 < rec["exposed"] <= rec["inflight"] + 1e-9
            if "overlap" in variant or variant == "ddp":
                # the first buckets ran during backward: that part is not exposed
                assert rec["exposed"] < 0.97 * rec["inflight"], (rank, variant, rec)
            else:  # blocking: every collective comes after the last gradient
                assert rec["exposed"] == pytest.approx(rec["inflight"], rel=1e-6), (rank, variant)


# ------------------------------------------------------------ failure paths
def _dead_peer_worker(rank: int, world: int) -> str:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = MLP(hidden=HIDDEN)
    syncer = build_sync(sync_cfg("ring", bucket_mb=SMALL_MB, overlap=True), model,
                        torch.device("cpu"), world)
    x, y = torch.randn(BATCH, 784), torch.randint(0, 10, (BATCH,))
    if rank == 1:
        return "left"  # its process group goes: rank 0's collectives lose their peer
    import time

    time.sleep(1.0)
    F.cross_entropy(syncer.wrapped(x), y).backward()
    t0 = time.perf_counter()
    try:
        syncer.sync()
    except RuntimeError as e:
        return f"raised after {time.perf_counter() - t0:.1f}s: {e}"
    return "no error"


@pytest.mark.dist
def test_a_failure_on_the_overlap_thread_is_raised_in_the_training_thread():
    results = run_world(_dead_peer_worker, 2, timeout=120)
    assert results[1] == "left"
    assert results[0].startswith("raised after"), results[0]
    assert "failed on the overlap thread" in results[0]


def _unused_worker(rank: int, world: int) -> str:
    model = MLP(hidden=HIDDEN)
    model.extra = torch.nn.Linear(2, 2)
    syncer = build_sync(sync_cfg("tree", overlap=True), model, torch.device("cpu"), world)
    x, y = torch.randn(2, 784), torch.randint(0, 10, (2,))
    try:
        syncer.preflight(lambda m=model: F.cross_entropy(m(x), y))
    except ValueError as e:
        return str(e)
    finally:
        syncer.close()
    return "accepted"


@pytest.mark.dist
def test_overlap_refuses_a_parameter_without_gradient_before_the_first_step():
    for msg in run_world(_unused_worker, 2, timeout=60):
        assert "extra.weight" in msg and "set sync.overlap=false" in msg


def test_ddp_without_overlap_is_refused():
    with pytest.raises(ValueError, match="DDP always overlaps"):
        check_sync(sync_cfg("ddp", overlap=False), 2)


def test_cli_ddp_overlap_false_is_one_line_exit_2(tmp_path):
    p = run_cli("sync=ddp", "sync.overlap=false", cwd=tmp_path, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines == ["error: sync=ddp sync.overlap=false: DDP always overlaps its bucket "
                     "all-reduces with backward; drop sync.overlap=false (or use "
                     "sync=allreduce sync.overlap=false for the same buckets after backward)"]
    assert not any(tmp_path.iterdir()) or not list(tmp_path.glob("**/summary.json"))


# ------------------------------------------------------------ end to end
@pytest.mark.dist
@pytest.mark.parametrize("extra", [["train.micro_batch=16"], ["train.compile=true"]],
                         ids=["micro_batch", "compile"])
@pytest.mark.slow
def test_cli_overlapped_run_records_exposed_and_in_flight(tmp_path, shared_data_root, extra):
    p = run_cli("sync=ring", "sync.overlap=true", "sync.bucket_mb=0.01", "model.hidden=[64,32]",
                "launcher.nproc_per_node=2", "train.epochs=1", "train.max_steps_per_epoch=12",
                "train.batch_size=32", "timing.tb_every=4", "log.progress=lines", *extra,
                f"data.root={shared_data_root}", cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    run = run_dir_of(p)
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "completed" and s["overlap"] is True
    assert 0 < s["comm_exposed_s"] <= s["comm_inflight_s"] == s["comm_time_s"]
    assert 0 < s["comm_exposed_fraction"] <= s["comm_fraction"] <= 1
    assert 0 < s["compute_s"] < s["step_time_ms_mean"] * s["steps_run"] / 1e3
    assert s["test_accuracy"] > 0.3
    rec = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert rec["overlap"] is True and 0 < rec["comm_exposed_s"] <= rec["comm_inflight_s"]
    tags = set(tensorboard(run).Tags()["scalars"])
    assert {"comm/inflight[ms/step]", "comm/exposed[ms/step]", "time/compute[ms/step]",
            "step/comm[ms]", "step/comm_exposed[ms]", "step/compute[ms]"} <= tags
