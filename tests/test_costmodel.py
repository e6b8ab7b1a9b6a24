"""ddp_lab.predict.costmodel against the bytes really sent.

On real gloo worlds of 2, 3, 4 and 5 ranks every send/recv algorithm of ddp_lab.collectives
runs on odd sizes (1, 7, 1001 elements, float32 and float64, several roots, pipelined
pieces), with torch.distributed's isend/irecv counted (tests/helpers.count_p2p_bytes, the
counter test_sync uses); the model's bytes must match rank by rank, exactly. Then every
synchroniser runs two steps on a model with odd parameter sizes: the bytes it records
(CommStats) must be the model's for its buckets, and, for the send/recv ones, the bytes
counted. Without processes: the busbw factors are nccl-tests' table, the report predicts
with the same costs, bytes are conserved.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ddp_lab.collectives as C
from ddp_lab.predict.costmodel import (
    ALGORITHMS, SHARD_ALIGN, SYNC_COLLECTIVES, Cost, busbw_factor, cost, sync_calls, sync_step,
)
from ddp_lab.report.alpha_beta import Fit, predict_comm_s

from helpers import count_p2p_bytes, run_world
from test_sync import sync_cfg

SIZES = (1, 7, 1001)
DTYPES = (torch.float32, torch.float64)
WORLDS = (2, 3, 4, 5)
SMALL_CHUNK = 64  # bytes: cuts the pipelined ring broadcast / ring steps into several pieces


# ----------------------------------------------------------------- the ranks' side
def _cases(world: int):
    """(label, collective, model algorithm, root, model kwargs, run(t, numel)) for every
    send/recv algorithm of ours. `t` is this rank's float tensor of `numel` elements."""
    last = world - 1
    cases = []
    for algo in ("linear", "tree", "butterfly", "ring"):
        cases.append((algo, "all_reduce", algo, 0, {},
                      lambda t, f=C.ALL_REDUCE[algo]: f(t)))
    cases.append(("ring_small_segments", "all_reduce", "ring", 0, {},
                  lambda t: C.all_reduce_ring(t, segment_bytes=SMALL_CHUNK)))
    for root in (0, last):
        for algo in ("linear", "tree", "ring"):
            cases.append((f"{algo}_root{root}", "broadcast", algo, root, {},
                          lambda t, f=C.BROADCAST[algo], r=root: f(t, src=r)))
        cases.append((f"ring_pipelined_root{root}", "broadcast", "ring", root,
                      {"chunk_bytes": SMALL_CHUNK},
                      lambda t, r=root: C.broadcast_ring(t, src=r, chunk_bytes=SMALL_CHUNK)))
        for algo in ("linear", "tree"):
            cases.append((f"{algo}_root{root}", "reduce", algo, root, {},
                          lambda t, f=C.REDUCE[algo], r=root: f(t, dst=r)))
    return cases


def _measure(counter: dict, fn) -> tuple[int, int]:
    counter.update(sent=0, recv=0)
    fn()
    return counter["sent"], counter["recv"]


def _collectives(rank: int, world: int, counter: dict) -> list[dict]:
    out = []
    for dtype in DTYPES:
        for numel in SIZES:
            def rec(label, coll, algo, model_numel, fn, root=0, **kw):
                sent, recv = _measure(counter, fn)
                out.append({"label": label, "coll": coll, "algo": algo, "numel": model_numel,
                            "dtype": str(dtype), "elem": dtype.itemsize, "root": root,
                            "kw": kw, "sent": sent, "recv": recv})

            for label, coll, algo, root, kw, run in _cases(world):
                t = torch.arange(numel, dtype=dtype) + rank
                rec(label, coll, algo, numel, lambda: run(t), root, **kw)
            # all-gather / reduce-scatter: `numel` elements per rank, the full buffer n times that
            piece, full = torch.full((numel,), float(rank), dtype=dtype), torch.zeros(world * numel, dtype=dtype)
            rec("ring", "all_gather", "ring", world * numel, lambda: C.all_gather_ring(full, piece))
            rec("ring", "reduce_scatter", "ring", world * numel,
                lambda: C.reduce_scatter_ring(piece, full))
            # the persistent ring: same bytes per call; its first call's receives are the only
            # ones waited for (the next call's stay posted until close(), not counted here)
            t = torch.ones(numel, dtype=dtype)
            plan = C.PrepostedRingAllReduce(t)
            rec("persistent", "all_reduce", "ring", numel, lambda: plan(t))
            plan.close()
    return out


class _Odd(nn.Module):
    """Parameters of odd sizes (21, 3, 15, 5 elements): uneven ring chunks, several buckets."""

    def __init__(self, dtype):
        super().__init__()
        self.a, self.b = nn.Linear(7, 3).to(dtype), nn.Linear(3, 5).to(dtype)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


SYNC_VARIANTS = [  # (label, sync, overrides, dtype)
    ("ddp", "ddp", {}, torch.float32),
    ("allreduce", "allreduce", {"bucket_mb": 1e-4}, torch.float32),
    ("allreduce_per_param", "allreduce", {"bucket_mb": 0}, torch.float64),
    ("ring", "ring", {"bucket_mb": 1e-4}, torch.float32),
    ("ring_prepost", "ring", {"bucket_mb": 1e-4, "prepost": True}, torch.float64),
    ("tree", "tree", {"bucket_mb": 1e-4}, torch.float32),
    ("butterfly", "butterfly", {}, torch.float64),
    ("reduce_broadcast", "reduce_broadcast", {"bucket_mb": 1e-4}, torch.float32),
    ("reduce_broadcast_root_last", "reduce_broadcast", {"root": -1}, torch.float64),
]
SYNC_STEPS = 2


def _wire_numels(syncer) -> list[int]:
    """The elements each collective call of one step puts on the wire (padding included)."""
    if syncer.name == "ddp":  # a model this small is one DDP bucket (the first is <= 1 MB)
        return [sum(p.numel() for p in syncer.module.parameters())]
    if syncer.name == "reduce_broadcast":
        return [b.numel for b in syncer.grad_buckets]
    if syncer.per_param:
        return [p.numel() for p in syncer.params]
    return [b.buffer.numel() for b in syncer.buckets]


def _syncs(rank: int, world: int, counter: dict) -> list[dict]:
    from ddp_lab.sync import SYNCS

    out = []
    for label, name, overrides, dtype in SYNC_VARIANTS:
        if overrides.get("root") == -1:
            overrides = {**overrides, "root": world - 1}
        torch.manual_seed(0)
        model = _Odd(dtype)
        syncer = SYNCS[name](sync_cfg(name, **overrides), model, torch.device("cpu"), world)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        counter.update(sent=0, recv=0)
        for step in range(SYNC_STEPS):
            x = torch.randn(4, 7, dtype=dtype, generator=torch.Generator().manual_seed(rank + step))
            loss = F.mse_loss(syncer.wrapped(x), torch.zeros(4, 5, dtype=dtype))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            syncer.sync()
            syncer.step(opt)
        comm = syncer.collect_comm()
        out.append({"label": label, "sync": name, "elem": dtype.itemsize,
                    "root": getattr(syncer, "root", 0), "wire": _wire_numels(syncer),
                    "exact": syncer.bytes_exact, "calls": comm.calls,
                    "sent": comm.bytes_sent, "recv": comm.bytes_recv, "counted": dict(counter)})
        syncer.close()
    return out


def _worker(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    counter = {"sent": 0, "recv": 0}
    count_p2p_bytes(counter)
    return {"collectives": _collectives(rank, world, counter), "syncs": _syncs(rank, world, counter)}


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"world{w}")
def world_run(request):
    return request.param, run_world(_worker, request.param, timeout=240)


# ----------------------------------------------------------------- the checks
@pytest.mark.dist
def test_collective_bytes_are_the_models_rank_by_rank(world_run):
    world, results = world_run
    checked = set()
    for rank, res in enumerate(results):
        for m in res["collectives"]:
            c = cost(m["coll"], m["algo"], m["numel"], world, m["elem"], root=m["root"], **m["kw"])
            where = f"{m['coll']}/{m['label']} {m['numel']} x {m['dtype']} rank {rank} of {world}"
            assert (m["sent"], m["recv"]) == (c.sent[rank], c.recv[rank]), where
            assert c.exact
            checked.add((m["coll"], m["algo"]))
    ours = {(coll, algo) for coll, algos in ALGORITHMS.items() for algo in algos if algo != "torch"}
    assert checked == ours  # every send/recv algorithm the model knows was counted


@pytest.mark.dist
def test_uneven_ring_chunks_are_counted_not_averaged(world_run):
    """On 7 elements over 3, 4 or 5 ranks the ring's chunks differ by one element, so ranks
    send different amounts: the ideal 2(n-1)/n figure, the same for all, would be wrong."""
    world, results = world_run
    sent = [next(m["sent"] for m in res["collectives"] if m["label"] == "ring"
                 and m["coll"] == "all_reduce" and m["numel"] == 7 and m["elem"] == 4)
            for res in results]
    if world > 2:
        assert len(set(sent)) > 1, sent
        assert 2 * (world - 1) * 7 * 4 / world not in sent
    assert tuple(sent) == cost("all_reduce", "ring", 7, world, 4).sent


@pytest.mark.dist
def test_synchronisers_record_the_models_bytes(world_run):
    world, results = world_run
    for rank, res in enumerate(results):
        for s in res["syncs"]:
            step = sync_step(s["sync"], s["wire"], world, s["elem"], root=s["root"])
            calls = sync_calls(s["sync"], s["wire"], world, s["elem"], root=s["root"])
            where = f"{s['label']} rank {rank} of {world}"
            assert s["calls"] == SYNC_STEPS * len(calls), where
            assert s["sent"] == SYNC_STEPS * step.sent[rank], where
            assert s["recv"] == SYNC_STEPS * step.recv[rank], where
            assert s["exact"] == step.exact, where
            if s["exact"]:  # our send/recv: the model is what went through send/recv
                assert (s["counted"]["sent"], s["counted"]["recv"]) == (s["sent"], s["recv"]), where
                assert s["sent"] > 0


# ----------------------------------------------------------- without processes
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 13])
@pytest.mark.parametrize("numel", [1, 7, 1001, 1 << 20])
def test_bytes_are_conserved(n, numel):
    """What the ranks send, they receive: for every algorithm, summed over ranks."""
    for coll, algos in ALGORITHMS.items():
        full = numel * n if coll in ("all_gather", "reduce_scatter") else numel
        for algo in algos:
            c = cost(coll, algo, full, n, 4, root=n - 1)
            assert len(c.sent) == len(c.recv) == max(n, 1)
            if c.exact:
                assert sum(c.sent) == sum(c.recv), (coll, algo)
            if n == 1:
                assert c == Cost(0, (0,), (0,), 0.0)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_textbook_figures(n):
    N, L = 1 << 20, math.ceil(math.log2(n))
    ring = cost("all_reduce", "ring", N, n, 1)
    assert ring.steps == 2 * (n - 1)
    assert abs(ring.max_sent - 2 * (n - 1) / n * N) < 2  # chunks differ by one element at most
    assert cost("all_reduce", "torch", N, n, 1).max_sent == int(2 * (n - 1) / n * N)
    k = int(math.log2(n))
    assert cost("all_reduce", "butterfly", N, n, 1).steps == k + (0 if 2 ** k == n else 2)
    assert cost("broadcast", "tree", N, n, 1).steps == L
    assert cost("broadcast", "linear", N, n, 1).sent[0] == (n - 1) * N
    assert cost("reduce", "linear", N, n, 1).recv[0] == (n - 1) * N
    assert cost("all_gather", "ring", N * n, n, 1).max_sent == (n - 1) * N
    for algo in ("linear", "tree", "butterfly"):  # the ring never sends more
        assert ring.max_sent <= cost("all_reduce", algo, N, n, 1).max_sent
    # element size scales bytes: a bf16 wire format is the same call with elem_size=2
    assert cost("all_reduce", "ring", N, n, 2).sent == tuple(2 * b for b in ring.sent)
    with pytest.raises(KeyError):
        cost("all_reduce", "ring_of_fire", N, n)


def test_phases_join():
    a, b = cost("reduce", "tree", 10, 3, 4), cost("broadcast", "tree", 10, 3, 4)
    both = a.then(b)
    assert both == cost("all_reduce", "tree", 10, 3, 4)
    assert both.time(1.0, 0.5) == a.time(1.0, 0.5) + b.time(1.0, 0.5)
    with pytest.raises(ValueError):
        a.then(cost("reduce", "tree", 10, 4, 4))


@pytest.mark.parametrize("n,table", [
    # nccl-tests PERFORMANCE.md: busbw = algbw * factor
    (2, {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "broadcast": 1, "reduce": 1}),
    (4, {"all_reduce": 1.5, "all_gather": 0.75, "reduce_scatter": 0.75, "broadcast": 1, "reduce": 1}),
    (8, {"all_reduce": 1.75, "all_gather": 0.875, "reduce_scatter": 0.875, "broadcast": 1, "reduce": 1}),
])
def test_busbw_factors_are_nccl_tests(n, table):
    for op, factor in table.items():
        assert busbw_factor(op, n) == factor
    assert busbw_factor("send_recv", n) == busbw_factor("p2p", n) == 1.0


def test_busbw_factor_edge_cases():
    assert busbw_factor("all_reduce", 1) == 0.0  # nothing crosses a bus with one rank
    with pytest.raises(ValueError, match="no bus-bandwidth factor for op 'alltoall'"):
        busbw_factor("alltoall", 4)


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_report_predicts_with_the_synchronisers_costs(n):
    """predict_comm_s prices exactly the calls whose bytes the synchroniser records."""
    fit = Fit(20e-6, 1e-9, 5, "torch", "ring", "global", n, 0.0)
    # bytes per bucket as a synchroniser puts them on the wire: zero1's padded to n shards
    # of whole SHARD_ALIGN fp32 elements (60 x 4 x 64 bytes splits so for n = 2..5)
    m, buckets = 60 * 4 * SHARD_ALIGN, 3
    for sync, phases in SYNC_COLLECTIVES.items():
        calls = sync_calls(sync, [m] * buckets, n, 1)
        expected = sum(c.time(fit.alpha_s, fit.beta_s_per_byte) for _, c in calls)
        got = predict_comm_s(sync, n, m * buckets * len(phases), buckets * len(phases), fit)
        assert math.isclose(got, expected, rel_tol=1e-12), sync
    # reduce_broadcast: the library's reduce and broadcast, as its recorded bytes; not a
    # tree reduce (what the report used to assume) nor a flat one (what the sync recorded)
    rb = sync_step("reduce_broadcast", [m], n, 1)
    assert rb == cost("reduce", "torch", m, n, 1).then(cost("broadcast", "torch", m, n, 1))
    assert rb.steps == n + math.ceil(math.log2(n))
