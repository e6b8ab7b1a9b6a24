"""DistContext's scalar collectives on real gloo worlds of 1, 2 and 3 ranks, and without
any process group (a single process that never initialised one)."""

from __future__ import annotations

import pytest
import torch

from ddp_lab.world.distributed import DistContext
from ddp_lab.world.env import DistEnv
from helpers import run_world


def _ctx(rank: int, world: int) -> DistContext:
    env = DistEnv(rank, rank, world, world, 0, 1, "127.0.0.1", 1, "test")
    return DistContext(env=env, backend="gloo", device=torch.device("cpu"))


def _scalars(rank: int, world: int) -> dict:
    ctx = _ctx(rank, world)
    # values that differ per rank, so a missing or wrong reduction shows
    x = [float(rank + 1), 10.0 * (rank + 1)]
    return {
        "collective": ctx.collective,
        "sum": ctx.reduce_floats(x),
        "mean": ctx.reduce_floats(x, "mean"),
        "max": ctx.reduce_float(float(rank), "max"),
        "min": ctx.reduce_float(float(rank) + 0.5, "min"),
        # large sums stay exact on CPU (float64): 2**40 + 1 per rank
        "big": ctx.reduce_float(2.0 ** 40 + 1),
        "any_last": ctx.any_rank(rank == world - 1),
        "any_none": ctx.any_rank(False),
        "objects": ctx.gather_objects({"rank": rank, "host": f"h{rank}"}),
        "to_root": ctx.gather_objects_to(("r", rank), dst=0),
        "to_last": ctx.gather_objects_to(rank, dst=world - 1),
    }


@pytest.mark.dist
@pytest.mark.parametrize("world", [1, 2, 3])
def test_scalar_collectives_on_real_worlds(world):
    results = run_world(_scalars, world)
    ranks = range(world)
    for rank, r in enumerate(results):
        assert r["collective"] is (world > 1)
        assert r["sum"] == [sum(q + 1 for q in ranks), sum(10.0 * (q + 1) for q in ranks)]
        assert r["mean"] == pytest.approx([(world + 1) / 2, 10 * (world + 1) / 2])
        assert r["max"] == world - 1
        assert r["min"] == 0.5
        assert r["big"] == world * (2.0 ** 40 + 1)
        assert r["any_last"] is True
        assert r["any_none"] is False
        assert r["objects"] == [{"rank": q, "host": f"h{q}"} for q in ranks]
        assert r["to_root"] == ([("r", q) for q in ranks] if rank == 0 else None)
        assert r["to_last"] == (list(ranks) if rank == world - 1 else None)


def test_scalar_collectives_without_a_process_group():
    import torch.distributed as dist

    assert not dist.is_initialized()
    ctx = _ctx(0, 1)
    assert not ctx.collective
    assert ctx.reduce_floats([1.5, 2.0], "mean") == [1.5, 2.0]
    assert ctx.reduce_float(3.0, "max") == 3.0
    assert ctx.any_rank(True) and not ctx.any_rank(False)
    assert ctx.gather_objects("x") == ["x"]
    assert ctx.gather_objects_to("x") == ["x"]
    with pytest.raises(ValueError, match="reduce op 'avg'"):
        ctx.reduce_floats([1.0], "avg")
