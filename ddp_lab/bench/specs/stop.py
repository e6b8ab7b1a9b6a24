"""What checking for a graceful stop, and the heartbeat record, cost a
training step (docs/failures.md, "What the stop check costs").

    python -m ddp_lab.bench.suite stop                  # 2 ranks, CPU gloo, 5 rounds
    python -m ddp_lab.bench.suite stop --rounds 9 --check-s 0.1

Each round one epoch of the trainer's step loop without the stop check
and one with it, alternating; printed: the check's time per step and a
step's bookkeeping (its timed phases and collective, which the heartbeat
record's thread reads), each against the step (targets: at most 1%
each).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import timeit
from pathlib import Path

from ...world.distributed import DistContext
from ...rank.epochs import StopControl
from ..scaffold import Bench, run_ranks, stamped_step
from ..suite import Spec, rounds

SPEC = Spec(compares="epochs with and without the stop check, alternating", rounds=5,
            ratios="time inside the check / step, epoch with / without the check, "
                   "step bookkeeping / step (targets <= 1%)")


class Timed(StopControl):
    """The stop check with its own time summed (what it adds to the
    loop)."""

    spent = 0.0

    def step(self):
        t = time.perf_counter()
        try:
            return super().step()
        finally:
            self.spent += time.perf_counter() - t


def worker(ctx: DistContext, args: argparse.Namespace) -> dict:
    bench = Bench(ctx, [f"data.root={args.data_root}", "timing.enabled=false"])
    steps = bench.steps(args.steps)
    # one for the run, as the trainer keeps one: its interval carries
    # over between epochs
    stopper = Timed(ctx, Path(args.run_dir), "SIGUSR2", args.check_s)

    def epoch(check: bool, n: int, seed_epoch: int) -> tuple[float, float, int]:
        parts = bench.parts(bench.cfg, seed_epoch)
        spent0, checks0 = stopper.spent, stopper.checks
        wall = bench.epoch(parts, n, stopper if check else None)
        if check:
            return wall, stopper.spent - spent0, stopper.checks - checks0
        return wall, 0.0, 0

    # warm-up: connections, allocations, the check's interval
    epoch(True, steps, 0)
    epoch(False, min(50, steps), 0)
    off, on, spent, checks = [], [], [], []
    # alternating order
    for r, check in rounds((False, True), args.rounds):
        wall, s, c = epoch(check, steps, r)
        (on if check else off).append(wall)
        if check:
            spent.append(s)
            checks.append(c)
        # the round's two epochs are done
        if ctx.env.rank == 0 and len(on) == len(off) == r:
            print(f"round {r}/{args.rounds}: without {off[-1]:.3f} s, with {on[-1]:.3f} s "
                  f"({checks[-1]} checks)", flush=True)
    stopper.restore()
    return {"off": off, "on": on, "spent": spent, "checks": checks, "steps": steps}


def record_share(run_dir: Path) -> tuple[float, float]:
    """Seconds a step's bookkeeping takes (its five timed phases and one
    timed collective, the attributes the heartbeat record reads, with
    the record's thread following them), and the notebook's compute-only
    step (best of 7 repeats each, in this process)."""
    import torch
    import torch.nn.functional as F

    from ddp_lab.config import compose
    from ddp_lab.models import build_model
    from ddp_lab.folder import heartbeat
    from ddp_lab.timing import Clock, CommRecorder, StepTimer

    clock = Clock(torch.device("cpu"))
    timer, comm = StepTimer(clock), CommRecorder(clock, 2)
    rec = heartbeat.Heartbeat(run_dir, 0)
    rec.follow(timer=timer, comm=comm)
    try:
        def one_round():
            stamped_step(timer, comm, nbytes=636_000)
            # what an epoch's end collects
            if len(timer._steps) >= 4000:
                timer.collect(), comm.collect()

        record_s = min(timeit.repeat(one_round, number=2000, repeat=7)) / 2000
    finally:
        rec.close()
    torch.manual_seed(0)
    # the notebook's MLP
    model = build_model(compose([]).model)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return record_s, min(timeit.repeat(step, number=50, repeat=7)) / 50


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=0, help="steps per epoch; 0 = the whole shard")
    p.add_argument("--check-s", type=float, default=1.0, help="train.stop_check_s")


def run(args: argparse.Namespace) -> dict | None:
    with tempfile.TemporaryDirectory() as run_dir:
        args.run_dir = run_dir
        results = run_ranks(worker, args.world, args)
    if results is None:
        return None
    r0 = results[0]
    steps = r0["steps"] * len(r0["on"])
    per_step = max(sum(x["on"]) for x in results.values()) / steps
    check_share = max(sum(x["spent"]) / sum(x["on"]) for x in results.values())
    med_off, med_on = statistics.median(r0["off"]), statistics.median(r0["on"])
    print(f"\n{args.world} ranks, gloo, mlp batch 64, sync=ddp, {r0['steps']} steps/epoch, "
          f"{args.rounds} rounds, train.stop_check_s={args.check_s}")
    print(f"step time (with checks):      {1e3 * per_step:.3f} ms")
    print(f"stop checks:                  {sum(r0['checks'])} over {steps} steps "
          f"(one per {steps / max(1, sum(r0['checks'])):.0f} steps)")
    print(f"time inside the check / step: {100 * check_share:.3f} %   (target <= 1 %)")
    print(f"epoch time with / without:    {med_on / med_off:.3f}   "
          f"(medians {med_on:.3f} s / {med_off:.3f} s)")
    with tempfile.TemporaryDirectory() as run_dir:
        record_s, step_s = record_share(Path(run_dir))
    print(f"step bookkeeping / step:      {100 * record_s / step_s:.3f} %   (target <= 1 %: "
          f"{record_s * 1e6:.2f} us a step against a compute-only step of {step_s * 1e3:.3f} ms)")
    return {"step_ms": 1e3 * per_step, "checks": sum(r0["checks"]), "steps": steps,
            "epoch_s": {"with": r0["on"], "without": r0["off"]}, "record_us": 1e6 * record_s,
            "ratios": {"time inside the check / step": check_share,
                       "epoch with / without the check": med_on / med_off,
                       "step bookkeeping / step": record_s / step_s}}
