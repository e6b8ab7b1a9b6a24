"""sync=naive (ddp_lab/sync/naive.py): one all-reduce per parameter, then divide.

On real 2 and 3 rank gloo worlds, naive and torch's DDP start from the same weights and
train the same STEPS steps on the same data (tests/test_sync.py's helpers): every rank
must end with DDP's weights, and naive's comm record must hold one all_reduce per
parameter per step, each with that parameter's bytes, in parameter order.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from ddp_lab.predict.costmodel import cost
from ddp_lab.config import check_sync
from ddp_lab.sync import SYNCS

from helpers import run_world
from test_sync import LR, MOMENTUM, STEPS, _close, _max_diff, global_batches, initial_model, sync_cfg, train_steps


def _worker(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    xs, ys = global_batches(world)
    out = {}
    for name in ("ddp", "naive"):
        model = initial_model()
        syncer = SYNCS[name](sync_cfg(name), model, torch.device("cpu"), world)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        train_steps(syncer, opt, xs, ys, rank)
        comm = syncer.collect_comm()
        out[name] = {
            "params": [p.detach().numpy().copy() for p in model.parameters()],
            "calls": comm.calls, "sent": comm.bytes_sent, "recv": comm.bytes_recv,
            "timed": [(c.op, c.payload) for c in comm.timed],  # in start order
        }
        syncer.close()
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"world{w}")
def world_run(request):
    return request.param, run_world(_worker, request.param, timeout=120)


@pytest.mark.dist
def test_naive_ends_with_ddps_weights_on_every_rank(world_run):
    world, results = world_run
    ddp = [torch.from_numpy(a) for a in results[0]["ddp"]["params"]]
    for rank, r in enumerate(results):
        naive = [torch.from_numpy(a) for a in r["naive"]["params"]]
        assert _close(naive, ddp), f"rank {rank} of {world}: {_max_diff(naive, ddp):.3g} from ddp"


@pytest.mark.dist
def test_naive_records_one_all_reduce_per_parameter_per_step(world_run):
    world, results = world_run
    params = list(initial_model().parameters())
    per_step = [("all_reduce", p.numel() * p.element_size()) for p in params]
    for rank, r in enumerate(results):
        rec = r["naive"]
        assert rec["calls"] == len(params) * STEPS
        assert rec["timed"] == per_step * STEPS
        # bytes: the library all-reduce as costmodel models it (a ring), per parameter
        model = [cost("all_reduce", "torch", p.numel(), world, p.element_size()) for p in params]
        assert rec["sent"] == STEPS * sum(c.sent[rank] for c in model)
        assert rec["recv"] == STEPS * sum(c.recv[rank] for c in model)


@pytest.mark.parametrize("key, value", [("overlap", True), ("compress", "fp16")])
def test_naive_refuses_overlap_and_compress_with_the_fix(key, value):
    with pytest.raises(ValueError, match=f"sync.{key}=.*use sync=allreduce sync.bucket_mb=0"):
        check_sync(sync_cfg("naive", **{key: value}), 2)


def test_naive_on_one_rank_communicates_nothing():
    model = initial_model()
    syncer = SYNCS["naive"](OmegaConf.create({"name": "naive"}), model, torch.device("cpu"), 1)
    model(torch.randn(2, 784)).sum().backward()
    before = [p.grad.clone() for p in model.parameters()]
    syncer.sync()
    assert syncer.collect_comm().calls == 0
    assert all(torch.equal(b, p.grad) for b, p in zip(before, model.parameters()))
