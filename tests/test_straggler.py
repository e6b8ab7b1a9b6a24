"""Stragglers, injected and found (issue 12 item 5).

Injection (`debug.slow_rank` / `slow_ms` / `jitter_ms`, ddp_lab/rank/epochs.py): its checks
(`debug_problem`, ddp_lab/config/run.py) are one line and exit 2 before anything
starts; the jitter has its own generator, so the training RNG does not move. Finding
(`ddp_lab.timing.StragglerTally`): the rule on known waits, then the acceptance on real
runs: `python -m ddp_lab` on 3 ranks (torchrun, gloo), 10 ms injected on rank 1 -> rank 1
named, its lateness 10 ms +- 30%, in metrics.jsonl, summary.json, TensorBoard, the console
and the report; nothing injected -> no rank named.
"""

from __future__ import annotations

import json
import random
import time

import pytest
import torch
from omegaconf import OmegaConf

from ddp_lab.config.run import debug_problem
from ddp_lab.rank.epochs import ComputeDelay
from ddp_lab.rank.records import injected
from ddp_lab.timing import STRAGGLER_MIN_STEPS, StragglerTally, stragglers

from helpers import describe, run_cli, run_dir_of, summary, tensorboard


def debug(slow_rank=-1, slow_ms=0.0, jitter_ms=0.0):
    return OmegaConf.create({"slow_rank": slow_rank, "slow_ms": slow_ms, "jitter_ms": jitter_ms})


# ------------------------------------------------------------------ injection
@pytest.mark.parametrize("overrides, expected", [
    (["debug.slow_rank=3"], "debug.slow_rank=3: must be -1 (none) or a rank, 0..2"),
    (["debug.slow_rank=-2"], "debug.slow_rank=-2: must be -1 (none) or a rank"),
    (["debug.slow_ms=-1"], "debug.slow_ms=-1.0: must be >= 0"),
    (["debug.jitter_ms=-0.5"], "debug.jitter_ms=-0.5: must be >= 0"),
])
def test_bad_delay_is_one_line_exit_2(tmp_path, overrides, expected):
    runs = tmp_path / "runs"
    proc = run_cli("launcher.nproc_per_node=3", *overrides, f"run.root={runs}",
                   f"data.root={tmp_path / 'data'}", cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, describe(proc)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], describe(proc)
    assert not runs.exists(), "nothing may be made before the check"


def test_delay_only_where_asked_and_leaves_the_training_rng_alone():
    assert debug_problem(debug(2, 5.0), 3) is None
    assert debug_problem(debug(-1), 1) is None
    assert ComputeDelay.from_config(debug(), 0, 0) is None
    assert ComputeDelay.from_config(debug(1, 5.0), 0, 0) is None  # another rank is slow
    assert ComputeDelay.from_config(debug(1, 0.0), 1, 0) is None
    assert injected(debug()) is None and injected(debug(1, 0.0)) is None
    assert injected(debug(1, 5.0, 2.0)) == {"slow_rank": 1, "slow_ms": 5.0, "jitter_ms": 2.0}

    torch.manual_seed(3)
    random.seed(3)
    want = (torch.rand(4), random.random())
    torch.manual_seed(3)
    random.seed(3)
    slow = ComputeDelay.from_config(debug(1, 3.0, 2.0), 1, seed=0)
    t0 = time.perf_counter()
    for _ in range(10):
        slow()
    took = time.perf_counter() - t0
    assert (torch.equal(torch.rand(4), want[0]), random.random()) == (True, want[1])
    assert 0.030 <= took < 0.5  # 10 x (3 ms + 0..2 ms): at least the fixed part
    # the jitter repeats for the same seed and rank, and differs between ranks
    a, b, c = (ComputeDelay(0, 5, 0, r) for r in (0, 0, 1))
    assert [a.rng.random() for _ in range(3)] == [b.rng.random() for _ in range(3)]
    assert a.rng.random() != c.rng.random()


# ------------------------------------------------------------------ the rule
def waits(n_steps: int, late: dict[int, float], world: int = 3, noise: float = 0.3e-3,
          seed: int = 0) -> list[list[float]]:
    """Comm seconds per step as a blocking all-reduce makes them: every rank waits from its
    arrival until the last one arrives, plus 1 ms of comm; arrival = noise + late[rank]."""
    rng = random.Random(seed)
    out = [[] for _ in range(world)]
    for _ in range(n_steps):
        arrive = [rng.uniform(0, noise) + late.get(r, 0.0) for r in range(world)]
        for r in range(world):
            out[r].append(max(arrive) - arrive[r] + 1e-3)
    return out


def test_rule_names_the_late_rank_and_its_lateness():
    # 5 ms late, each rank's arrival spread 0..2 ms: the median lead over 200 steps is 5 ms
    # to within its sampling error (under 0.1 ms); the largest lead would be about 6.6 ms,
    # the largest over the other ranks at each step (max for the in-step median) 5.3 ms
    t = StragglerTally.from_waits(waits(200, {1: 5e-3}, noise=2e-3))
    named = t.named()
    assert named["rank"] == 1 and named["share"] == 1.0
    assert named["late_ms"] == pytest.approx(5.0, abs=0.15)
    ev = stragglers([1.0, 1.0, 1.0], t)
    assert ev["last_share"] == [0.0, 1.0, 0.0] and ev["steps_compared"] == 200


@pytest.mark.parametrize("case, w", [
    ("nothing injected", waits(500, {})),
    ("noise larger than the threshold", waits(500, {}, noise=5e-3)),
    ("jitter on every rank", waits(500, {}, noise=5e-3, seed=7)),
    ("late but too few steps", waits(STRAGGLER_MIN_STEPS - 1, {2: 5e-3})),
    ("last most often by a hair", waits(500, {0: 0.1e-3})),
    ("world of one", [[1e-3] * 100]),
    ("no collective", [[0.0] * 100] * 3),
    ("ranks disagree on steps", [[1e-3] * 100, [1e-3] * 99, [1e-3] * 100]),
])
def test_rule_names_no_rank_unless_clearly_one(case, w):
    assert StragglerTally.from_waits(w).named() is None, case


def test_two_ranks_need_three_quarters_and_epochs_add_up():
    # world 2: chance alone makes a rank last half the time; 75% is asked for
    t = StragglerTally.from_waits(waits(100, {1: 2e-3}, world=2))
    assert t.named()["rank"] == 1
    mixed = StragglerTally(2)
    mixed.merge(StragglerTally.from_waits(waits(60, {1: 2e-3}, world=2)))
    mixed.merge(StragglerTally.from_waits(waits(40, {0: 2e-3}, world=2)))
    assert mixed.steps == 100 and mixed.share(1) == 0.6 and mixed.named() is None


# ------------------------------------------------------------------ acceptance
STEPS = 300  # per rank: medians over 300 steps hold under the load of a shared 2-core VM


def train3(tmp_path, data_root, *overrides):
    proc = run_cli("launcher.nproc_per_node=3", "train.epochs=1",
                   f"train.max_steps_per_epoch={STEPS}", "train.eval_batch_size=2000",
                   "log.progress=lines", "train.checkpoint=false", "timing.trace=false",
                   f"data.root={data_root}", f"run.root={tmp_path / 'runs'}", *overrides,
                   cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, describe(proc)
    run_dir = run_dir_of(proc)
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return proc, run_dir, records


@pytest.mark.dist
@pytest.mark.slow
def test_injected_straggler_is_named_with_its_lateness(tmp_path, shared_data_root):
    proc, run_dir, records = train3(tmp_path, shared_data_root, "debug.slow_rank=1",
                                    "debug.slow_ms=10")
    s = summary(run_dir)
    said = f"{s.get('straggler')} {records[-1]['stragglers']}\n{describe(proc)}"
    assert s["injected_delay"] == {"slow_rank": 1, "slow_ms": 10.0, "jitter_ms": 0.0}
    assert s["straggler"] is not None and s["straggler"]["rank"] == 1, said
    # 10 ms +- 30%: under load the median lead misses the delay by up to ~2 ms either way
    # (docs/sync.md "Stragglers, injected and found": 4.98 and 6.87 ms for 5 ms; CI once 3.93)
    assert 7.0 <= s["straggler"]["late_ms"] <= 13.0, said
    assert records[0]["straggler"]["rank"] == 1, said
    assert records[0]["stragglers"]["last_share"][1] == records[0]["straggler"]["share"]
    assert "[rank 0] epoch 1/1  straggler: rank 1, the others wait" in proc.stdout

    acc = tensorboard(run_dir)
    assert [e.value for e in acc.Scalars("stragglers/rank")] == [1.0]
    assert acc.Scalars("stragglers/late[ms]")[0].value == pytest.approx(
        records[0]["straggler"]["late_ms"], rel=1e-5)

    report = run_cli(str(run_dir), "--out", str(tmp_path / "report"), "--no-plots", cwd=tmp_path,
                     module="ddp_lab.report", timeout=120)
    assert report.returncode == 0, describe(report)
    text = "\n".join(p.read_text() for p in (tmp_path / "report").glob("*.md"))
    assert f"rank 1 +{s['straggler']['late_ms']:.2f} ms" in text, text[-3000:]


@pytest.mark.dist
@pytest.mark.slow
def test_nothing_injected_names_no_rank(tmp_path, shared_data_root):
    proc, run_dir, records = train3(tmp_path, shared_data_root)
    s = summary(run_dir)
    said = f"{records[-1]['stragglers']}\n{describe(proc)}"
    assert s["injected_delay"] is None
    assert records[0]["stragglers"]["steps_compared"] >= STEPS * 0.9, said
    assert records[0]["straggler"] is None and s["straggler"] is None, said
    assert "straggler: rank" not in proc.stdout


def test_delay_runs_once_per_step_inside_forward_also_with_micro_batches():
    """The trainer's own loop, one process (no collective): the delay is called once per
    step, first micro-batch only, and its time is in the forward phase."""
    from ddp_lab.models import MLP
    from ddp_lab.sync.allreduce import AllReduceSync
    from ddp_lab.timing import Clock, StepTimer
    from ddp_lab.rank.epochs import EpochBatches
    from ddp_lab.step import run_steps

    sync_cfg = OmegaConf.create({"name": "allreduce", "bucket_mb": 25})
    model = MLP()
    syncer = AllReduceSync(sync_cfg, model, torch.device("cpu"), 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []

    def delay():
        calls.append(1)
        time.sleep(0.004)

    batches = iter([(torch.randn(64, 784), torch.randint(0, 10, (64,)))] * 3)
    timer = StepTimer(Clock(torch.device("cpu")))
    run_steps(syncer, opt, EpochBatches(batches, range(3), timer, delay=delay), timer,
              micro_batch=16)
    steps = timer.collect()
    assert len(calls) == 3
    assert all(s.durations()["forward"] >= 0.004 for s in steps)
