"""Tests for ddp_lab.collectives against torch.distributed's own collectives.

Each multi-process test spawns ONE world (gloo on CPU, or nccl on CUDA) whose ranks run
a whole suite of checks -- every registered algorithm x op x dtype x odd length x root --
comparing each result with the built-in collective on identical random inputs. Ranks
record mismatches instead of raising (so they stay in step), write them to a JSON file,
and the parent asserts. Init uses a file:// store and a 60 s timeout; the parent also
kills a world that is still running after WORLD_DEADLINE_S, so a bug fails, never hangs.
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed import ReduceOp

import ddp_lab.collectives as C
from helpers import world_context

LENGTHS = (1, 7, 13, 1001)  # odd, mostly not divisible by the world size
OPS = ("SUM", "PRODUCT", "MAX", "MIN", "AVG")
DTYPES = (torch.float32, torch.int32)
SEED = 20240611
PG_TIMEOUT = datetime.timedelta(seconds=60)
WORLD_DEADLINE_S = 240
TORCH_OP = {"SUM": ReduceOp.SUM, "PRODUCT": ReduceOp.PRODUCT, "MAX": ReduceOp.MAX,
            "MIN": ReduceOp.MIN}
SUBGROUPS = {4: [[1, 3], [0, 2]], 5: [[0, 2, 4], [1, 3]]}


# ----------------------------------------------------------------------------- worker side


class Checker:
    """Collects mismatches on one rank; every rank runs the same sequence of cases."""

    def __init__(self, global_rank: int, device: torch.device):
        self.global_rank = global_rank
        self.device = device
        self.case = 0  # seeds the inputs; identical sequence on every rank
        self.rot = 0  # rotates roots through the group across cases
        self.count = 0
        self.failures: list[str] = []

    def inputs(self, shape, dtype, op="SUM") -> torch.Tensor:
        """Random per-rank input, reproducible from (SEED, global rank, case number)."""
        self.case += 1
        g = torch.Generator().manual_seed(SEED + 100_003 * self.global_rank + self.case)
        if dtype.is_floating_point:
            x = torch.randn(shape, generator=g, dtype=torch.float64)
            if op == "PRODUCT":  # magnitudes in [0.5, 1.5): no overflow / underflow
                x = (torch.rand(shape, generator=g, dtype=torch.float64) + 0.5) * x.sign()
        else:
            lo, hi = (-3, 4) if op == "PRODUCT" else (-1000, 1000)
            x = torch.randint(lo, hi, shape, generator=g)
        return x.to(dtype).to(self.device)

    def check(self, name: str, got: torch.Tensor, want: torch.Tensor, exact: bool) -> None:
        self.count += 1
        if got.shape != want.shape or got.dtype != want.dtype:
            self.failures.append(f"{name}: got {got.dtype}{tuple(got.shape)}, "
                                 f"want {want.dtype}{tuple(want.shape)}")
            return
        ok = torch.equal(got, want) if exact else torch.allclose(got, want, rtol=1e-5, atol=1e-5)
        if not ok:
            bad = (got != want) if exact else ~torch.isclose(got, want, rtol=1e-5, atol=1e-5)
            idx = bad.reshape(-1).nonzero()[:5].reshape(-1).tolist()
            self.failures.append(
                f"rank {self.global_rank} {name}: {int(bad.sum())} bad elements, first at flat "
                f"{idx}: got {got.reshape(-1)[idx].tolist()} want {want.reshape(-1)[idx].tolist()}"
            )

    def expect_raises(self, name: str, exc: type[BaseException], fn, match: str = "") -> None:
        self.count += 1
        try:
            fn()
        except exc as e:
            if match not in str(e):
                self.failures.append(f"{name}: {exc.__name__} without {match!r}: {e}")
        else:
            self.failures.append(f"{name}: did not raise {exc.__name__}")


def _exact(dtype: torch.dtype, op: str) -> bool:
    """Results that do not depend on the reduction order are compared bitwise."""
    return not dtype.is_floating_point or op in ("MAX", "MIN")


def _ops_for(dtype: torch.dtype):
    return OPS if dtype.is_floating_point else tuple(o for o in OPS if o != "AVG")


def _ref_all_reduce(x, op, group, n):
    dist.all_reduce(x, TORCH_OP.get(op, ReduceOp.SUM), group=group)
    if op == "AVG":
        x.div_(n)


def _ref_reduce(x, dst, op, group, n, is_root):
    dist.reduce(x, dst, TORCH_OP.get(op, ReduceOp.SUM), group=group)
    if op == "AVG" and is_root:
        x.div_(n)


def _ref_reduce_scatter(out, inp, op, group, n):
    dist.reduce_scatter_tensor(out, inp, TORCH_OP.get(op, ReduceOp.SUM), group=group)
    if op == "AVG":
        out.div_(n)


def _same_on_all_ranks(ck: Checker, name: str, t: torch.Tensor, group, n: int) -> None:
    """All-reduce results must be bitwise identical on every rank (DDP relies on it)."""
    gathered = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(gathered, t.contiguous(), group=group)
    for i, other in enumerate(gathered):
        ck.check(f"{name} identical on group rank {i}", other, gathered[0], exact=True)


def _with_segmented(registry, n):
    """(name, fn, kwargs-for-numel) for every entry, plus the ring entry again with a tiny
    ``segment_bytes`` so each ring step's message is cut into ~3 uneven pieces."""
    for algo, fn in registry.items():
        yield algo, fn, lambda numel: {}
        if algo == "ring":
            yield "ring/segmented", fn, lambda numel: {"segment_bytes": max(1, 4 * numel // (3 * n))}


def _suite(ck: Checker, group) -> None:
    """Every registered algorithm of every collective vs torch.distributed, on ``group``."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    granks = dist.get_process_group_ranks(group) if group is not None else list(range(n))

    def next_root() -> int:
        root = granks[ck.rot % n]
        ck.rot += 1
        return root

    # ---- broadcast (ring also pipelined in ~5 uneven pieces)
    for algo, fn in C.BROADCAST.items():
        for pipelined in ((False, True) if algo == "ring" else (False,)):
            for length in LENGTHS:
                for dtype in DTYPES:
                    src = next_root()
                    x = ck.inputs((length,), dtype)
                    kw = {"chunk_bytes": max(1, x.numel() * x.element_size() // 5)} if pipelined else {}
                    ours, ref = x.clone(), x.clone()
                    fn(ours, src, group=group, **kw)
                    dist.broadcast(ref, src, group=group)
                    ck.check(f"broadcast[{algo}{'/piped' if pipelined else ''}] len={length} "
                             f"{dtype} src={src}", ours, ref, exact=True)

    # ---- reduce (non-root tensors must come back untouched)
    for algo, fn in C.REDUCE.items():
        for length in LENGTHS:
            for dtype in DTYPES:
                for op in _ops_for(dtype):
                    dst = next_root()
                    is_root = granks[r] == dst
                    x = ck.inputs((length,), dtype, op)
                    ours, ref = x.clone(), x.clone()
                    fn(ours, dst, op=getattr(ReduceOp, op), group=group)
                    _ref_reduce(ref, dst, op, group, n, is_root)
                    name = f"reduce[{algo}] {op} len={length} {dtype} dst={dst}"
                    if is_root:
                        ck.check(name, ours, ref, exact=_exact(dtype, op))
                    elif algo != "torch":  # torch makes no promise about non-roots
                        ck.check(name + " (non-root unchanged)", ours, x, exact=True)

    # ---- all-reduce (ring also with every step's message cut into ~3 uneven pieces)
    for algo, fn, kw in _with_segmented(C.ALL_REDUCE, n):
        for length in LENGTHS:
            for dtype in DTYPES:
                for op in _ops_for(dtype):
                    x = ck.inputs((length,), dtype, op)
                    ours, ref = x.clone(), x.clone()
                    fn(ours, getattr(ReduceOp, op), group=group, **kw(length))
                    _ref_all_reduce(ref, op, group, n)
                    name = f"all_reduce[{algo}] {op} len={length} {dtype}"
                    ck.check(name, ours, ref, exact=_exact(dtype, op))
                    if length == 1001:
                        _same_on_all_ranks(ck, name, ours, group, n)

    # ---- the textbook ring (collectives/ring.py, gloo): all_reduce_ring's steps and bits
    if dist.get_backend(group) == "gloo":
        for length in LENGTHS:
            for dtype in DTYPES:
                x = ck.inputs((length,), dtype, "SUM")
                ours, batched = x.clone(), x.clone()
                C.all_reduce_ring_textbook(ours, group=group)
                C.all_reduce_ring(batched, group=group)
                ck.check(f"all_reduce_ring_textbook len={length} {dtype}", ours, batched,
                         exact=True)

    # ---- all-gather: flat output, (n, m) output, list output, input aliasing its slot
    for algo, fn, kw in _with_segmented(C.ALL_GATHER, n):
        for length in LENGTHS:
            for dtype in DTYPES:
                x = ck.inputs((length,), dtype)
                ref = torch.empty(n * length, dtype=dtype, device=ck.device)
                dist.all_gather_into_tensor(ref, x, group=group)
                name = f"all_gather[{algo}] len={length} {dtype}"
                out = torch.full((n * length,), -7, dtype=dtype, device=ck.device)
                fn(out, x, group=group, **kw(n * length))
                ck.check(name + " flat", out, ref, exact=True)
                out2 = torch.full((n, length), -7, dtype=dtype, device=ck.device)
                fn(out2, x, group=group, **kw(n * length))
                ck.check(name + " 2-D", out2.reshape(-1), ref, exact=True)
                outs = [torch.full((length,), -7, dtype=dtype, device=ck.device) for _ in range(n)]
                fn(outs, x, group=group, **kw(n * length))
                ck.check(name + " list", torch.cat(outs), ref, exact=True)
                out3 = torch.full((n * length,), -7, dtype=dtype, device=ck.device)
                out3[r * length:(r + 1) * length] = x
                fn(out3, out3[r * length:(r + 1) * length], group=group, **kw(n * length))
                ck.check(name + " in-place", out3, ref, exact=True)

    # ---- gather: the root's output holds every rank's piece in group-rank order (torch's
    # gather as the reference); the inputs stay as they were
    for algo, fn in C.GATHER.items():
        for length in LENGTHS:
            for dtype in DTYPES:
                dst = next_root()
                is_root = granks[r] == dst
                x = ck.inputs((length,), dtype)
                keep = x.clone()
                ref = torch.empty(n * length, dtype=dtype, device=ck.device)
                dist.all_gather_into_tensor(ref, x, group=group)
                out = torch.full((n, length), -7, dtype=dtype, device=ck.device) if is_root else None
                fn(out, x, dst, group=group)
                name = f"gather[{algo}] len={length} {dtype} dst={dst}"
                if is_root:
                    ck.check(name, out.reshape(-1), ref, exact=True)
                ck.check(name + " (input unchanged)", x, keep, exact=True)

    # ---- reduce-scatter: tensor input (left untouched), list input, output aliasing input
    for algo, fn, kw in _with_segmented(C.REDUCE_SCATTER, n):
        for length in LENGTHS:
            for dtype in DTYPES:
                for op in _ops_for(dtype):
                    x = ck.inputs((n * length,), dtype, op)
                    ref = torch.empty(length, dtype=dtype, device=ck.device)
                    _ref_reduce_scatter(ref, x.clone(), op, group, n)
                    name = f"reduce_scatter[{algo}] {op} len={length} {dtype}"
                    exact = _exact(dtype, op)
                    inp = x.clone()
                    out = torch.full((length,), -7, dtype=dtype, device=ck.device)
                    fn(out, inp, getattr(ReduceOp, op), group=group, **kw(n * length))
                    ck.check(name, out, ref, exact)
                    if algo != "torch":
                        ck.check(name + " input untouched", inp, x, exact=True)
                    if length == 13 and algo != "torch":
                        out = torch.full((length,), -7, dtype=dtype, device=ck.device)
                        fn(out, list(x.clone().split(length)), op, group=group, **kw(n * length))
                        ck.check(name + " list input", out, ref, exact)
                        inp = x.clone()
                        fn(inp[r * length:(r + 1) * length], inp, op, group=group, **kw(n * length))
                        ck.check(name + " in-place", inp[r * length:(r + 1) * length], ref, exact)

    # ---- shapes: 2-D, non-contiguous, float64, scalar, empty
    shaped = [((3, 5), torch.float32, False), ((5, 3), torch.float64, True), ((), torch.float32, False),
              ((0,), torch.float32, False), ((2, 0, 3), torch.int32, False)]
    for shape, dtype, transpose in shaped:
        for op in ("SUM", "AVG") if dtype.is_floating_point else ("SUM",):
            x = ck.inputs(shape, dtype, op)
            if transpose:
                x = x.t()  # non-contiguous view
            tag = f"shape={tuple(x.shape)} {dtype}{' non-contig' if transpose else ''} {op}"
            ref = x.clone(memory_format=torch.contiguous_format)
            _ref_all_reduce(ref, op, group, n)
            for algo, fn in C.ALL_REDUCE.items():
                ours = x.clone()
                if transpose:
                    ours = x.t().clone().t()  # keep it non-contiguous
                fn(ours, op, group=group)
                ck.check(f"all_reduce[{algo}] {tag}", ours, ref, exact=False)
            dst = next_root()
            ref = x.clone(memory_format=torch.contiguous_format)
            _ref_reduce(ref, dst, op, group, n, granks[r] == dst)
            for algo, fn in C.REDUCE.items():
                ours = x.t().clone().t() if transpose else x.clone()
                fn(ours, dst, op, group=group)
                if granks[r] == dst:
                    ck.check(f"reduce[{algo}] {tag}", ours, ref, exact=False)
            src = next_root()
            ref = x.clone(memory_format=torch.contiguous_format)
            dist.broadcast(ref, src, group=group)
            for algo, fn in C.BROADCAST.items():
                ours = x.t().clone().t() if transpose else x.clone()
                fn(ours, src, group=group)
                ck.check(f"broadcast[{algo}] {tag} src={src}", ours, ref, exact=True)

    # ---- group-local roots (group_src= / group_dst=) and op spellings
    x = ck.inputs((7,), torch.float32)
    for algo in ("linear", "tree", "ring"):
        ours, ref = x.clone(), x.clone()
        C.BROADCAST[algo](ours, group=group, group_src=n - 1)
        dist.broadcast(ref, granks[n - 1], group=group)
        ck.check(f"broadcast[{algo}] group_src={n - 1}", ours, ref, exact=True)
    for algo in ("linear", "tree"):
        ours, ref = x.clone(), x.clone()
        C.REDUCE[algo](ours, op="max", group=group, group_dst=n - 1)
        _ref_reduce(ref, granks[n - 1], "MAX", group, n, r == n - 1)
        if r == n - 1:
            ck.check(f"reduce[{algo}] group_dst={n - 1} op='max'", ours, ref, exact=True)
    ref = x.clone()
    _ref_all_reduce(ref, "MIN", group, n)
    for spelling in ("min", "MIN", ReduceOp(ReduceOp.MIN), ReduceOp.MIN):
        ours = x.clone()
        C.all_reduce_ring(ours, spelling, group=group)
        ck.check(f"all_reduce_ring op={spelling!r}", ours, ref, exact=True)

    # ---- errors are raised on every rank before any communication
    xi = torch.ones(5, dtype=torch.int32, device=ck.device)
    for algo, fn in C.ALL_REDUCE.items():
        ck.expect_raises(f"all_reduce[{algo}] AVG int", ValueError,
                         lambda: fn(xi.clone(), ReduceOp.AVG, group=group), "AVG")
        ck.expect_raises(f"all_reduce[{algo}] BAND", ValueError,
                         lambda: fn(xi.clone(), ReduceOp.BAND, group=group), "supported")
    for algo, fn in C.REDUCE.items():
        ck.expect_raises(f"reduce[{algo}] AVG int", ValueError,
                         lambda: fn(xi.clone(), granks[0], ReduceOp.AVG, group=group), "AVG")
    for algo, fn in C.REDUCE_SCATTER.items():
        ck.expect_raises(f"reduce_scatter[{algo}] AVG int", ValueError,
                         lambda: fn(xi[:1].clone(), xi.new_ones(n), "avg", group=group), "AVG")
    ck.expect_raises("reduce_scatter_ring bad sizes", ValueError,
                     lambda: C.reduce_scatter_ring(xi.clone(), xi.new_ones(n * 5 + 1), group=group))
    ck.expect_raises("all_gather_ring bad sizes", ValueError,
                     lambda: C.all_gather_ring(xi.new_ones(n * 5 - 1), xi, group=group))
    ck.expect_raises("broadcast_tree no root", ValueError,
                     lambda: C.broadcast_tree(xi.clone(), group=group))
    outsider = next((g for g in range(dist.get_world_size()) if g not in granks), None)
    if outsider is not None:
        ck.expect_raises("broadcast_ring src outside group", ValueError,
                         lambda: C.broadcast_ring(xi.clone(), outsider, group=group), "not a member")


def _persistent_suite(ck: Checker, group) -> None:
    """PrepostedRingAllReduce: repeated calls on one plan (each reusing the receives the
    previous call posted) match torch's all_reduce, with other traffic on the same ranks in
    between, with pieces, after close() and with a forgotten, unclosed plan alongside."""
    n = dist.get_world_size(group)
    granks = dist.get_process_group_ranks(group) if group is not None else list(range(n))

    def interfere():
        # tag-0 point-to-point and a backend collective between two calls of a plan
        t = ck.inputs((5,), torch.float32)
        C.broadcast_ring(t, granks[0], group=group)
        u = ck.inputs((3,), torch.float32)
        dist.all_reduce(u, group=group)

    def calls(name, plan, shape, dtype, op, k=3):
        for i in range(k):
            x = ck.inputs(shape, dtype, op)
            want = x.clone()
            _ref_all_reduce(want, op, group, n)
            plan(x)
            ck.check(f"{name} call {i}", x, want, _exact(dtype, op))
            _same_on_all_ranks(ck, f"{name} call {i}", x, group, n)
            interfere()

    for dtype in DTYPES:
        for op in _ops_for(dtype):
            for length in LENGTHS:
                name = f"persistent[{op},{dtype},{length}]"
                with C.PrepostedRingAllReduce(torch.empty(length, dtype=dtype), op,
                                               group) as plan:
                    calls(name, plan, (length,), dtype, op)
    # pieces: each ring step's message cut into ~3 uneven pieces
    plan = C.PrepostedRingAllReduce(torch.empty(1001), "SUM", group,
                                     segment_bytes=4 * 1001 * 4 // (3 * n) + 1)
    calls("persistent segmented", plan, (1001,), torch.float32, "SUM")
    plan.close()
    calls("persistent segmented after close", plan, (1001,), torch.float32, "SUM", k=2)
    plan.close()
    plan.close()  # nothing posted: a no-op
    # a plan left unclosed (its receives still posted) does not capture a newer plan's data
    tags = C.PlanTags()
    forgotten = C.PrepostedRingAllReduce(torch.empty(7, 13), "SUM", group, tags=tags)
    calls("persistent 2-D", forgotten, (7, 13), torch.float32, "SUM", k=1)
    newer = C.PrepostedRingAllReduce(torch.empty(7, 13), "MAX", group, tags=tags)
    calls("persistent newer plan", newer, (7, 13), torch.float32, "MAX", k=2)
    calls("persistent forgotten plan again", forgotten, (7, 13), torch.float32, "SUM", k=1)
    for p in (forgotten, newer):
        p.close()
    ck.expect_raises("persistent wrong shape", ValueError,
                     lambda: newer(torch.empty(8, 13)), "one plan per tensor shape")
    ck.expect_raises("persistent AVG int", ValueError,
                     lambda: C.PrepostedRingAllReduce(torch.empty(3, dtype=torch.int32), "avg",
                                                       group), "AVG")
    if n > 1:
        ck.expect_raises("persistent on meta", ValueError,
                         lambda: C.PrepostedRingAllReduce(torch.empty(3, device="meta"),
                                                           group=group), "gloo group and CPU")


def _worker(rank, world_size, init_file, backend, out_dir, scenario):
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        extra = {"device_id": device}  # eager NCCL init: see docs/collectives.md
    else:
        device, extra = torch.device("cpu"), {}
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size, timeout=PG_TIMEOUT, **extra)
    ck = Checker(rank, device)
    t0 = time.perf_counter()
    if scenario == "world":
        _suite(ck, None)
    elif scenario == "persistent":
        _persistent_suite(ck, None)
        if world_size == 4:  # and on the sub-groups {1,3} and {0,2}, side by side
            groups = [(ranks, dist.new_group(ranks)) for ranks in SUBGROUPS[world_size]]
            for ranks, g in groups:
                if rank in ranks:
                    _persistent_suite(ck, g)
                else:  # outside the group: the plan's calls leave the tensor alone
                    x = ck.inputs((7,), torch.float32)
                    y = x.clone()
                    C.PrepostedRingAllReduce(y, group=g)(y)
                    ck.check("persistent non-member", y, x, exact=True)
    else:
        groups = [(ranks, dist.new_group(ranks)) for ranks in SUBGROUPS[world_size]]
        for ranks, g in groups:
            if rank in ranks:
                _suite(ck, g)
        # A process outside ``group`` returns at once and leaves its tensors alone.
        for ranks, g in groups:
            if rank not in ranks:
                x = ck.inputs((7,), torch.float32)
                for coll in ("broadcast", "reduce"):
                    for algo, fn in C.COLLECTIVES[coll].items():
                        if algo != "torch":
                            y = x.clone()
                            fn(y, ranks[0], group=g)
                            ck.check(f"{coll}[{algo}] non-member", y, x, exact=True)
                for algo, fn in C.ALL_REDUCE.items():
                    if algo != "torch":
                        y = x.clone()
                        fn(y, group=g)
                        ck.check(f"all_reduce[{algo}] non-member", y, x, exact=True)
                y = x.clone()
                C.all_reduce_ring_textbook(y, group=g)
                ck.check("all_reduce_ring_textbook non-member", y, x, exact=True)
    elapsed = time.perf_counter() - t0
    Path(out_dir, f"rank{rank}.json").write_text(
        json.dumps({"count": ck.count, "failures": ck.failures, "seconds": elapsed}))
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- parent side


def _run_world(tmp_path: Path, world_size: int, backend: str = "gloo", scenario: str = "world"):
    out_dir = tmp_path / "results"
    out_dir.mkdir()
    world_context()  # the forkserver's preload (helpers.py): ranks start without importing torch
    ctx = mp.start_processes(
        _worker,
        args=(world_size, str(tmp_path / "store"), backend, str(out_dir), scenario),
        nprocs=world_size, join=False, start_method="forkserver",
    )
    deadline = time.monotonic() + WORLD_DEADLINE_S
    while not ctx.join(timeout=2):  # raises if a rank died with an exception
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"{backend} world of {world_size} still running after {WORLD_DEADLINE_S}s")
    results = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world_size)]
    failures = [f for res in results for f in res["failures"]]
    assert not failures, f"{len(failures)} mismatches, e.g.:\n" + "\n".join(failures[:25])
    return results


@pytest.mark.dist
@pytest.mark.parametrize(
    "world_size",
    [1, 2, 3, pytest.param(4, marks=pytest.mark.slow), pytest.param(5, marks=pytest.mark.slow)],
)
def test_matches_torch_distributed_gloo(tmp_path, world_size):
    results = _run_world(tmp_path, world_size)
    # Every rank ran hundreds of checks: the suite did not silently shrink.
    assert min(res["count"] for res in results) > 400


@pytest.mark.dist
@pytest.mark.parametrize("world_size", [4, pytest.param(5, marks=pytest.mark.slow)])
def test_sub_groups_gloo(tmp_path, world_size):
    """Groups {1,3} + {0,2} of 4 ranks, and {0,2,4} + {1,3} of 5: global/group rank
    translation, non-contiguous members, non-power-of-two sub-group, non-members."""
    results = _run_world(tmp_path, world_size, scenario="subgroups")
    assert all(res["count"] > 400 for res in results)


@pytest.mark.dist
@pytest.mark.parametrize(
    "world_size",
    [1, 2, 3, pytest.param(4, marks=pytest.mark.slow), pytest.param(5, marks=pytest.mark.slow)],
)
def test_persistent_ring_gloo(tmp_path, world_size):
    """PrepostedRingAllReduce against torch.distributed.all_reduce (4 ranks: also on two
    sub-groups at once); a receive matched to the wrong message fails or hangs here."""
    results = _run_world(tmp_path, world_size, scenario="persistent")
    assert min(res["count"] for res in results) > 150


@pytest.mark.gpu
@pytest.mark.dist
def test_matches_torch_distributed_nccl(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    if torch.cuda.device_count() < 2:
        pytest.skip("nccl needs one GPU per rank; fewer than 2 CUDA devices visible")
    if not dist.is_nccl_available():
        pytest.skip("this torch build has no nccl")
    _run_world(tmp_path, min(torch.cuda.device_count(), 4), backend="nccl")


# ----------------------------------------------------------------------------- single process


def test_normalize_op_spellings_and_errors():
    for name in C.SUPPORTED_OPS:
        assert C.normalize_op(getattr(ReduceOp, name)) == name
        assert C.normalize_op(ReduceOp(getattr(ReduceOp, name))) == name
        assert C.normalize_op(name.lower()) == name
    for bad in (ReduceOp.BAND, ReduceOp.BXOR, "mean", 3, None):
        with pytest.raises(ValueError, match="SUM, PRODUCT, MAX, MIN, AVG"):
            C.normalize_op(bad)


def test_errors_before_any_communication():
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="AVG"):
        C.all_reduce_ring(torch.ones(3, dtype=torch.int64), "avg")
    with pytest.raises(ValueError, match="supported"):
        C.all_reduce_butterfly(torch.ones(3), ReduceOp.BOR)
    with pytest.raises(RuntimeError, match="init_process_group"):
        C.all_reduce_tree(torch.ones(3))


def test_registries_are_complete():
    assert set(C.ALL_REDUCE) == {"linear", "ring", "butterfly", "tree", "torch"}
    assert set(C.BROADCAST) == {"linear", "tree", "ring", "torch"}
    assert set(C.REDUCE) == {"linear", "tree", "torch"}
    assert set(C.ALL_GATHER) == set(C.REDUCE_SCATTER) == {"ring", "torch"}
    assert C.COLLECTIVES["all_reduce"] is C.ALL_REDUCE
