"""The lesson's loop (ddp_lab/train.py) as a bare loop: `train(cfg, ctx)` with the null
twins of its parts (no checkpoint, no stop, no records) on a real gloo group trains (the
test loss falls, the accuracy rises) and writes nothing; and the loop calls the parts it is
handed where they act, in the order a run needs them."""

from __future__ import annotations

import itertools

import pytest


def _cfg(data_root, run_dir, *more):
    from ddp_lab.config import compose

    return compose(["launcher.nproc_per_node=1", "train.epochs=2", "train.eval_batch_size=2000",
                    "sync=ring", f"data.root={data_root}", f"run.dir={run_dir}", *more])


@pytest.mark.dist
def test_the_bare_loop_trains_and_writes_nothing(shared_data_root, tmp_path, monkeypatch):
    import torch.distributed as dist

    from ddp_lab.step import evaluate
    from ddp_lab.timing import Clock
    from ddp_lab.train import build_parts, load_data, train
    from ddp_lab.world.distributed import local_gloo_world
    from ddp_lab.world.ports import free_port

    monkeypatch.chdir(tmp_path)
    # one epoch of 100 steps
    cfg = _cfg(shared_data_root, tmp_path / "run", "train.epochs=1", "train.batch_size=600")
    ctx = local_gloo_world(0, 1, free_port())
    try:
        splits = load_data(cfg.data, cfg.train, ctx)
        untrained = build_parts(cfg, ctx, Clock(ctx.device)).model
        before = evaluate(untrained, splits, 2000, ctx)
        parts = train(cfg, ctx)
        after = evaluate(parts.model, splits, 2000, ctx)
    finally:
        dist.destroy_process_group()
    assert after[0] < before[0] / 2 and after[1] > 0.8 > before[1], (before, after)
    assert parts.syncer.name == "ring" and parts.model is parts.syncer.module
    assert list(tmp_path.iterdir()) == []


class Seen:
    """The null twins, each call recorded: 5 steps an epoch."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def load(self, parts):
        from ddp_lab.train import Start

        self.calls.append(("load",))
        return Start()

    def save(self, epochs_done):
        self.calls.append(("save", epochs_done))

    def start(self, *args):
        self.calls.append(("start",))

    def batches(self, epoch, shard):
        shard.set_epoch(epoch)
        self.calls.append(("batches", epoch))
        return itertools.islice(shard.iter_from(0), 5)

    def end(self, batches, loss_sum, correct):
        self.calls.append(("end", int(correct)))
        return None, None

    def epoch(self, measured, test):
        self.calls.append(("epoch", test[1]))

    def between(self, epochs_done):
        self.calls.append(("between", epochs_done))

    def finish(self, parts):
        self.calls.append(("finish",))
        return parts


@pytest.mark.dist
def test_the_loop_calls_its_parts_where_they_act(shared_data_root, tmp_path):
    import torch.distributed as dist

    from ddp_lab.train import train
    from ddp_lab.world.distributed import local_gloo_world
    from ddp_lab.world.ports import free_port

    cfg = _cfg(shared_data_root, tmp_path / "run")
    ctx = local_gloo_world(0, 1, free_port())
    seen = Seen()
    try:
        train(cfg, ctx, checkpoint=seen, epochs=seen, records=seen)
    finally:
        dist.destroy_process_group()
    names = [c[0] for c in seen.calls]
    assert names == ["load", "start", "start",
                     "batches", "end", "save", "epoch", "between",
                     "batches", "end", "save", "epoch", "between",
                     "finish"], seen.calls
    assert [c[1] for c in seen.calls if c[0] in ("batches", "save")] == [0, 1, 1, 2]
    # 10 steps of 64 samples: well past chance (10%) on the test set
    accuracy = [c[1] for c in seen.calls if c[0] == "epoch"]
    assert accuracy[-1] > 0.4, accuracy
