"""The training step (ddp_lab/step.py), in this process, no collective: what `run_steps`
hands back besides the updated weights."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from ddp_lab.models import MLP
from ddp_lab.rank.epochs import EpochBatches
from ddp_lab.step import run_steps
from ddp_lab.sync.allreduce import AllReduceSync
from ddp_lab.timing import Clock, StepTimer


@pytest.mark.parametrize("micro_batch", [0, 16], ids=["whole", "micro-batches"])
def test_run_steps_counts_the_right_training_predictions(micro_batch):
    """Train accuracy: the predictions each forward made, counted as the notebook's
    check_accuracy does (argmax == label); lr 0, so every step predicts with the same
    weights and a plain forward gives the expected count."""
    torch.manual_seed(0)
    model = MLP()
    syncer = AllReduceSync(OmegaConf.create({"name": "allreduce", "bucket_mb": 25}), model,
                           torch.device("cpu"), 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    batches = [(torch.randn(64, 784), torch.randint(0, 10, (64,))) for _ in range(3)]
    with torch.no_grad():
        want = sum(int((model(x).argmax(1) == y).sum()) for x, y in batches)
        want_loss = sum(float(torch.nn.functional.cross_entropy(model(x), y)) * 64 for x, y in batches)
    timer = StepTimer(Clock(torch.device("cpu")))
    epoch = EpochBatches(iter(batches), range(3), timer)
    loss_sum, correct = run_steps(syncer, opt, epoch, timer, micro_batch=micro_batch)
    assert epoch.stop is None and epoch.samples == 192 and epoch.done == 3
    assert int(correct) == want and 0 < want < 192
    assert float(loss_sum) == pytest.approx(want_loss, rel=1e-5)



def test_the_epoch_tally_grows_past_its_buffers_and_sums_what_each_step_gave():
    """Steps of uneven sizes (a last batch short, sizes no power of two) past the tally's
    first buffers: the loss summed in float64 step by step and the correct predictions
    counted as the notebook does, from the steps' own tensors."""
    from ddp_lab.step import EpochTally

    torch.manual_seed(0)
    tally = EpochTally(torch.device("cpu"), steps=2, samples=50)
    steps = [(torch.rand(()), torch.randn(n, 10), torch.randint(0, 10, (n,)))
             for n in (37, 37, 37, 37, 11)]
    for loss, out, y in steps:
        tally.add(loss, out, y)
    loss_sum, correct = tally.sums()
    assert loss_sum.dtype == torch.float64 and correct.dtype == torch.int64
    assert float(loss_sum) == pytest.approx(
        sum(float(loss.double()) * len(y) for loss, _, y in steps), rel=1e-12)
    assert int(correct) == sum(int((out.argmax(1) == y).sum()) for _, out, y in steps) > 0
    # every prediction right: every sample of every step counts, the last one's too
    right = EpochTally(torch.device("cpu"), steps=2, samples=50)
    for _, _, y in steps:
        right.add(torch.zeros(()), torch.nn.functional.one_hot(y, 10).float(), y)
    assert int(right.sums()[1]) == 37 * 4 + 11
    assert [float(x) for x in EpochTally(torch.device("cpu")).sums()] == [0.0, 0.0]

@pytest.mark.parametrize("every_rank, shown", [(False, False), (True, True)])
def test_console_shows_other_ranks_only_with_log_ranks_all(tmp_path, capsys, every_rank, shown):
    """log.ranks=all: every rank's lines on the console, each prefixed with its rank (torchrun
    --tee 3's view); the default: rank 0's, and the others' errors."""
    from ddp_lab.world.env import DistEnv
    from ddp_lab.folder.metrics import setup_logging

    env = DistEnv(rank=1, local_rank=1, world_size=2, local_world_size=2, node_rank=0,
                  num_nodes=1, master_addr="127.0.0.1", master_port=1, source="single")
    log = setup_logging(env, tmp_path, every_rank=every_rank)
    log.info("epoch 1/1  train loss 1.0")
    log.error("failed: a reason")
    out = capsys.readouterr().out
    assert ("[rank 1] epoch 1/1" in out) == shown and "[rank 1] failed: a reason" in out
    assert "epoch 1/1" in (tmp_path / "logs" / "rank1.log").read_text()


def test_epoch_batches_end_after_the_step_the_ranks_agreed_to_stop_at():
    """EpochBatches asks its stopper after every step (never before the first) and ends
    the epoch there, keeping why; the steps and samples done are its own count."""
    from ddp_lab.rank.epochs import StopInfo

    class StopAfter:
        def __init__(self, n):
            self.n, self.asked = n, 0

        def step(self):
            self.asked += 1
            return StopInfo("preempted", "test") if self.asked == self.n else None

    timer = StepTimer(Clock(torch.device("cpu")))
    data = iter([(torch.zeros(4, 784), torch.zeros(4, dtype=torch.int64))] * 5)
    stopper = StopAfter(2)
    epoch = EpochBatches(data, range(5), timer, stopper)
    seen = [len(y) for _, y in epoch]
    assert seen == [4, 4] and stopper.asked == 2
    assert epoch.done == 2 and epoch.samples == 8
    assert epoch.stop == StopInfo("preempted", "test")


def test_real_steps_sampled_as_the_records_pick_stand_for_the_others():
    """600 real training steps timed as a run's records time them (the sampled steps' phases,
    the others' start and end): exactly the records' steps carry phases, the others one span,
    and the epoch's phases add up to every step's time. (Whether a sampled step costs what an
    unsampled one does is a timing claim: the epoch benchmark holds it, not this test.)"""

    from ddp_lab.rank.records import sampled_steps
    from ddp_lab.timing import PHASES, epoch_timing
    from ddp_lab.timing.comm import CommStats

    torch.manual_seed(0)
    model = MLP()
    syncer = AllReduceSync(OmegaConf.create({"name": "allreduce", "bucket_mb": 25}), model,
                           torch.device("cpu"), 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = [(torch.randn(64, 784), torch.randint(0, 10, (64,))) for _ in range(600)]
    timer = StepTimer(Clock(torch.device("cpu")))
    timer.watch_grads(model)
    picked = sampled_steps(0, 600, every=50, keep=10)
    timer.sample(picked)
    run_steps(syncer, opt, EpochBatches(iter(batches), range(600), timer), timer)
    steps = timer.collect()
    assert [i for i, s in enumerate(steps) if s.phased] == sorted(picked)
    assert all(len(s.spans) == 1 and s.compute_end is None for s in steps if not s.phased)
    assert all([n for n, _, _ in s.spans] == list(PHASES) for s in steps if s.phased)
    t = epoch_timing(steps, CommStats())
    assert t["sampled"] == len(picked)
    assert sum(t["phases"][p]["total"] for p in PHASES) == pytest.approx(
        sum(s.seconds() for s in steps), rel=1e-9)
    assert t["phases"]["step"]["total"] == pytest.approx(sum(s.end - s.start for s in steps), rel=0.02)
