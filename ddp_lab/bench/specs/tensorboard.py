"""What TensorBoard's live per-step points cost a training step.

    python -m ddp_lab.bench.suite tensorboard               # every 10th step written, vs a 4 ms step
    python -m ddp_lab.bench.suite tensorboard --every 1

One process: a loop of steps stamped by the trainer's StepTimer, in
rotating rounds of `none` (the stamps only), `live` (the trainer's
StepWatch) and `naive` (add_scalar and flush per point); printed: the
median extra CPU time per step against `none` (docs/timing.md,
"TensorBoard").
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from ...folder.metrics import RunFolderSink
from ...rank.records import step_scalars
from ...timing import PHASES, Clock, CommRecorder, CommStats, StepTimer, StepWatch
from ..scaffold import stamped_step
from ..suite import Spec, rounds

SPEC = Spec(compares="a step's stamps alone, with the trainer's live points, with add_scalar "
                     "and flush per point", rounds=5, data=False,
            ratios="extra CPU per step of live and naive, as a share of a --of-ms step")


def work(n: int) -> None:
    sum(range(n))  # holds the GIL throughout


def calibrate(seconds: float) -> int:
    """The `work` that takes `seconds` of CPU here."""
    n, t = 100_000, 0.0
    while t < 0.2:
        n *= 2
        t0 = time.process_time()
        work(n)
        t = time.process_time() - t0
    return max(1, int(n * seconds / t))


def loop(way: str, steps: int, every: int, n: int, folder: Path) -> float:
    """CPU seconds per step of `steps` steps of `n` work, written
    `way`."""
    clock = Clock(torch.device("cpu"))
    timer, comm = StepTimer(clock), CommRecorder(clock, world_size=2)
    sink = writer = None
    if way == "live":
        sink = RunFolderSink(folder)
        sink.truncate_after(0, 0)
        sink.tensorboard("bench", "config", {"sync": "ring"})

        # what Telemetry._live_point does
        def point(n, times, calls):
            stats = CommStats(timed=calls)
            sink.steps([(n, step_scalars(times, stats.per_step_seconds([times])[0],
                                         stats.per_step_exposed([times])[0], 1))])

        StepWatch(timer, comm, every, point).begin(0)
    elif way == "naive":
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(folder / "naive"))
    part = n // len(PHASES)
    t0 = time.process_time()
    for s in range(steps):
        stamped_step(timer, comm, lambda: work(part))
        if writer is not None and (s + 1) % every == 0:
            st = timer.ready(s)
            for tag, v in step_scalars(st, 0.0, 0.0, 1).items():
                writer.add_scalar(tag, v, s + 1)
            writer.flush()
    for w in (sink, writer):
        if w is not None:
            # the writer's thread has written everything: its CPU is
            # counted
            w.close()
    return (time.process_time() - t0) / steps


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--every", type=int, default=10, help="timing.tb_every")
    ap.add_argument("--step-ms", type=float, default=0.0, help="work in each step")
    ap.add_argument("--of-ms", type=float, default=4.0, help="the step to compare with")


def run(args: argparse.Namespace) -> dict:
    ways = ["none", "live", "naive"]
    took: dict[str, list[float]] = {w: [] for w in ways}
    n = calibrate(args.step_ms / 1e3) if args.step_ms > 0 else 0
    with tempfile.TemporaryDirectory() as tmp:
        # rotating order: drift hits every way alike
        for r, way in rounds(ways, args.rounds):
            took[way].append(loop(way, args.steps, args.every, n, Path(tmp) / f"{way}{r}"))
    base = statistics.median(took["none"])
    print(f"{args.steps} steps ({args.step_ms} ms of work each: {base * 1e3:.3f} ms CPU with "
          f"the stamps), a point every {args.every} step(s), median of {args.rounds} rounds")
    print(f"| way | extra CPU per step (us) | share of a {args.of_ms:g} ms step |\n| --- | --- | --- |")
    found = {}
    for way in ("live", "naive"):
        extra = statistics.median(t - b for t, b in zip(took[way], took["none"]))
        found[f"{way}: extra CPU / {args.of_ms:g} ms step"] = extra / (args.of_ms / 1e3)
        print(f"| {way} | {extra * 1e6:.1f} | {100 * extra / (args.of_ms / 1e3):.2f}% |")
    return {"cpu_s_per_step": took, "ratios": found}
