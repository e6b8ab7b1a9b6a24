"""The lesson's loop (ddp_lab/train.py) runs with any machinery that
keeps its small protocol: here a plain one of a few lines, no run
folder, in one process. The loop calls it in the order the protocol
says, and its training is real (the test accuracy rises)."""

from __future__ import annotations

import itertools
from contextlib import nullcontext

import pytest


class Plain:
    """The least machinery: every epoch from the first, 5 steps each,
    nothing kept; each call recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def building(self):
        self.calls.append(("building",))
        return nullcontext()

    def start(self, clock, parts, splits, steps):
        from ddp_lab.timing import StepTimer

        self.timer = StepTimer(clock, enabled=False)
        self.calls.append(("start",))
        return 0, steps

    def batches(self, epoch, shard):
        shard.set_epoch(epoch)
        self.calls.append(("batches", epoch))
        return itertools.islice(shard.iter_from(0), 5)

    def steps_done(self, batches, loss_sum, correct) -> None:
        self.calls.append(("steps_done", int(correct)))

    def epoch_done(self, test) -> None:
        self.calls.append(("epoch_done", test[1]))

    def finish(self, parts):
        self.calls.append(("finish",))
        return parts


@pytest.mark.dist
def test_the_loop_runs_with_a_plain_machinery(shared_data_root):
    import torch.distributed as dist

    from ddp_lab.config import compose
    from ddp_lab.train import train
    from ddp_lab.world.distributed import local_gloo_world
    from ddp_lab.world.ports import free_port

    cfg = compose(["launcher.nproc_per_node=1", "train.epochs=2",
                   "train.eval_batch_size=2000", "sync=ring",
                   f"data.root={shared_data_root}"])
    ctx = local_gloo_world(0, 1, free_port())
    try:
        machinery = Plain()
        parts = train(cfg, ctx, machinery)
    finally:
        dist.destroy_process_group()
    names = [c[0] for c in machinery.calls]
    assert names == ["building", "start",
                     "batches", "steps_done", "epoch_done",
                     "batches", "steps_done", "epoch_done",
                     "finish"], machinery.calls
    assert [c[1] for c in machinery.calls if c[0] == "batches"] == [0, 1]
    # 10 steps of 64 samples: well past chance (10%) on the test set
    accuracy = [c[1] for c in machinery.calls if c[0] == "epoch_done"]
    assert accuracy[-1] > 0.4, accuracy
    assert parts.syncer.name == "ring" and parts.model is parts.syncer.module
