"""The benchmarks of the run's machinery, each against going without it: the stop check (stop), the
time to the first line and the report's (start), TensorBoard's live points (tensorboard), timing
(timing); each described by its `*_DOC`."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

import torch

from ...folder.metrics import RunFolderSink
from ...rank.epochs import StopControl
from ...rank.records import step_scalars
from ...timing import Clock, CommRecorder, CommStats, PHASES, StepTimer, StepWatch
from ...world.distributed import DistContext
from ..scaffold import Bench, run_ranks, stamped_step
from ..suite import Benchmark, REPO, rounds, side_by_side, Spec, table, UsageError


# ------------------------------------------------------------------ stop
STOP_DOC = """What checking for a graceful stop, and the heartbeat record, cost a
training step (docs/failures.md, "What the stop check costs").

    python -m ddp_lab.bench.suite stop                  # 2 ranks, CPU gloo, 5 rounds
    python -m ddp_lab.bench.suite stop --rounds 9 --check-s 0.1

Each round one epoch of the trainer's step loop without the stop check and one with it,
alternating; printed: the check's time per step and a step's bookkeeping (its timed phases and
collective, which the heartbeat record's thread reads), each against the step (targets: at most 1%
each).
"""

STOP_SPEC = Spec(compares="epochs with and without the stop check, alternating", rounds=5,
                 ratios="time inside the check / step, epoch with / without the check, "
                        "step bookkeeping / step (targets <= 1%)", world=2, steps=0)


class Timed(StopControl):
    """The stop check with its own time summed (what it adds to the loop)."""

    spent = 0.0

    def step(self):
        t = time.perf_counter()
        try:
            return super().step()
        finally:
            self.spent += time.perf_counter() - t


def stop_worker(ctx: DistContext, args: argparse.Namespace) -> dict:
    bench = Bench(ctx, [f"data.root={args.data_root}", "timing.enabled=false"])
    steps = bench.steps(args.steps)
    # one for the run, as the trainer keeps one: its interval carries over between epochs
    stopper = Timed(ctx, Path(args.run_dir), "SIGUSR2", args.check_s)

    def epoch(check: bool, n: int, seed_epoch: int) -> tuple[float, float, int]:
        parts = bench.parts(bench.cfg, seed_epoch)
        spent0, checks0 = stopper.spent, stopper.checks
        wall = bench.epoch(parts, n, stopper if check else None)
        return wall, stopper.spent - spent0, stopper.checks - checks0

    # warm-up: connections, allocations, the check's interval
    epoch(True, steps, 0)
    epoch(False, min(50, steps), 0)
    off, on, spent, checks = [], [], [], []
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
    """Seconds a step's bookkeeping takes (its five timed phases and one timed collective, the
    attributes the heartbeat record reads, with the record's thread following them), and the
    notebook's compute-only step (best of 7 repeats each, in this process)."""
    import torch.nn.functional as F

    from ddp_lab.config import compose
    from ddp_lab.models import build_model
    from ddp_lab.folder import heartbeat

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


def stop_add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check-s", type=float, default=1.0, help="train.stop_check_s")


def stop_run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as args.run_dir:
        results = run_ranks(stop_worker, args.world, args)
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


# ------------------------------------------------------------------ start
START_DOC = """How soon a command answers: the first console line of a run, and the
report's start.

    python -m ddp_lab.bench.suite start                      # this checkout, 10 rounds
    python -m ddp_lab.bench.suite start --vs ../before       # side by side with another

Each the median (min-max) over rounds: `python -m ddp_lab train.epochs=1` to its first console line
(then SIGTERM), and `python -m ddp_lab.report --help`; `--vs DIR` runs DIR's ddp_lab with the same
interpreter (docs/performance.md, "Time to the first step").
"""

START_SPEC = Spec(compares="this checkout and --vs DIR's, each command in every round", rounds=10,
                  ratios="after / before: the first console line, the report's start")


def took_s(tree: Path, work: Path, argv: list[str], first_line: bool) -> float:
    """Seconds `python -m ARGV` of checkout `tree` takes in `work`: to its first console
    line (then its own stop, SIGTERM: its ranks checkpoint and end) if `first_line`, else to its
    end."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", *argv], cwd=work, text=True,
                            env=dict(os.environ, PYTHONPATH=str(tree)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if first_line else None)
    line = proc.stdout.readline() if first_line else proc.communicate()[0]
    took = time.perf_counter() - t0
    if first_line:
        proc.terminate()
        proc.communicate(timeout=120)
        if not line.startswith("[ddp_lab] starting"):
            sys.exit(f"error: {tree}: the first line was {line.strip()!r}")
    elif proc.returncode:
        sys.exit(f"error: {tree}: python -m {' '.join(argv)} failed ({proc.returncode})")
    return took


def start_add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pause", type=float, default=2.0, help="seconds between runs")
    p.add_argument("--vs", type=Path, help="another checkout, timed in the same rounds")


def start_check(args: argparse.Namespace) -> None:
    if args.vs and not (args.vs / "ddp_lab" / "__main__.py").is_file():
        raise UsageError(f"--vs {args.vs}: not a ddp_lab checkout")


def start_run(args: argparse.Namespace) -> dict:
    trees = {"before": args.vs.resolve(), "after": REPO} if args.vs else {"this": REPO}
    got = {name: {"first line": [], "report": []} for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for name, tree in trees.items():
                got[name]["first line"].append(took_s(tree, Path(tmp), [
                    "ddp_lab", "train.epochs=1", f"data.root={args.data_root}",
                    f"run.root={Path(tmp) / 'runs'}"], first_line=True))
                time.sleep(args.pause)
                got[name]["report"].append(took_s(tree, Path(tmp), ["ddp_lab.report", "--help"], False))
    print(f"\n{args.rounds} round(s), load average {os.getloadavg()[0]:.2f} at the end")
    found, rows = {}, []
    for measure in ("first line", "report"):
        rows.append([measure, *(f"{statistics.median(v):.2f} s ({min(v):.2f}-{max(v):.2f})"
                                for v in (got[name][measure] for name in trees))])
        if args.vs:
            ratio = statistics.median(got["after"][measure]) / statistics.median(got["before"][measure])
            rows[-1].append(f"{ratio:.2f}")
            found[f"{measure}: after / before"] = ratio
    print(table(["measure", *trees, *(["after / before"] if args.vs else [])], rows,
                "l" * (1 + len(trees) + bool(args.vs))))
    return {"seconds": got, "ratios": found}


# ------------------------------------------------------------------ tensorboard
TENSORBOARD_DOC = """What TensorBoard's live per-step points cost a training step.

    python -m ddp_lab.bench.suite tensorboard               # every 10th step written, vs a 4 ms step
    python -m ddp_lab.bench.suite tensorboard --every 1

One process: a loop of steps stamped by the trainer's StepTimer, in
rotating rounds of `none` (the stamps only), `live` (the trainer's
StepWatch) and `naive` (add_scalar and flush per point); printed: the
median extra CPU time per step against `none` (docs/timing.md,
"TensorBoard").
"""

TENSORBOARD_SPEC = Spec(compares="a step's stamps alone, with the trainer's live points, with add_scalar "
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
    """CPU seconds per step of `steps` steps of `n` work, written `way`."""
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
            # the writer's thread has written everything: its CPU is counted
            w.close()
    return (time.process_time() - t0) / steps


def tensorboard_add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--every", type=int, default=10, help="timing.tb_every")
    ap.add_argument("--step-ms", type=float, default=0.0, help="work in each step")
    ap.add_argument("--of-ms", type=float, default=4.0, help="the step to compare with")


def tensorboard_run(args: argparse.Namespace) -> dict:
    n = calibrate(args.step_ms / 1e3) if args.step_ms > 0 else 0
    with tempfile.TemporaryDirectory() as tmp:
        took = side_by_side(["none", "live", "naive"], args.rounds, lambda way, r: loop(
            way, args.steps, args.every, n, Path(tmp) / f"{way}{r}"))
    base = statistics.median(took["none"])
    print(f"{args.steps} steps ({args.step_ms} ms of work each: {base * 1e3:.3f} ms CPU with "
          f"the stamps), a point every {args.every} step(s), median of {args.rounds} rounds")
    extra = {way: statistics.median(t - b for t, b in zip(took[way], took["none"]))
             for way in ("live", "naive")}
    print(table(["way", "extra CPU per step (us)", f"share of a {args.of_ms:g} ms step"],
                [(w, f"{e * 1e6:.1f}", f"{100 * e / (args.of_ms / 1e3):.2f}%") for w, e in extra.items()],
                "lll"))
    found = {f"{w}: extra CPU / {args.of_ms:g} ms step": e / (args.of_ms / 1e3) for w, e in extra.items()}
    return {"cpu_s_per_step": took, "ratios": found}


# ------------------------------------------------------------------ timing
TIMING_DOC = """What timing costs a run: the worker's whole training with timing on (the
default) against `timing.enabled=false`, alternating in one process per rank (docs/performance.md,
"A count you pin, and timing on against off").

    python -m ddp_lab.bench.suite timing                     # 1 rank, 8 rounds of 2 epochs each way
    python -m ddp_lab.bench.suite timing --world 2 --threads 1 --extra sync=ring

Each run is `ddp_lab.rank.main.run_training` as the worker calls it (its records, TensorBoard's
live points, the trace, the stop control; no checkpoint) in a fresh run folder; the process and
its process group are the same for both, so what differs is timing alone. A round's ratio is its
run with timing over its run without (medians of their epochs), and the figure is the median of
the rounds' ratios: a shared VM's slow drift cancels within a round (goal <= 1.03). Beside it, what
the wall clock of a noisy VM cannot resolve: the process's CPU time with timing over without, a
step (every thread's, the work outside the epoch's clock included: an upper bound).
"""

TIMING_SPEC = Spec(compares="the worker's training with timing on and off, alternating in one "
                            "process", rounds=8,
                   ratios="timing on / off, the median of the rounds' ratios (goal <= 1.03)",
                   world=1)


def timing_worker(ctx: DistContext, args: argparse.Namespace) -> dict:
    import json

    from ...config import compose
    from ...rank.main import run_training
    from ...train import train

    torch.set_num_threads(args.threads)
    base = [f"data.root={args.data_root}", f"train.epochs={args.epochs}", "train.checkpoint=false",
            f"train.max_steps_per_epoch={args.max_steps}", "log.progress=false", *args.extra]
    took: dict[str, list[float]] = {"on": [], "off": [], "cpu on": [], "cpu off": []}
    # round 0: the warm-up (allocations, the first TensorBoard writer), not counted
    for r, way in [(0, "on"), (0, "off"), *rounds(("off", "on"), args.rounds)]:
        run_dir = Path(args.run_dir) / f"{way}{r}"
        run_dir.mkdir()
        cfg = compose([*base, *(["timing.enabled=false"] if way == "off" else [])])
        cpu = time.process_time()
        run_training(train, cfg, ctx, run_dir)
        cpu = time.process_time() - cpu
        if r and ctx.env.is_main:
            records = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
            took[way].append(statistics.median(rec["epoch_time_s"] for rec in records))
            # the whole run's CPU, every thread's (TensorBoard's writer too), a step
            took[f"cpu {way}"].append(cpu / sum(rec["steps"] for rec in records))
    return took


def timing_add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=1, help="torch threads a rank")
    p.add_argument("--epochs", type=int, default=2, help="epochs a run")
    p.add_argument("--max-steps", type=int, default=0, help="steps an epoch; 0: the whole shard")
    p.add_argument("--extra", nargs="*", default=[], help="overrides for both ways")


def timing_run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as args.run_dir:
        took = run_ranks(timing_worker, args.world, args)[0]
    paired = [on / off for on, off in zip(took["on"], took["off"])]
    ratio = statistics.median(paired)
    overrides = "".join(f" {o}" for o in args.extra)
    print(f"\n{args.world} rank(s) x {args.threads} thread(s), gloo, the defaults{overrides}, "
          f"{args.epochs} epoch(s) a run, {args.rounds} rounds, load average "
          f"{os.getloadavg()[0]:.2f} at the end")
    print(table(["round", "timing on (s/epoch)", "off", "on / off"],
                [(i, f"{on:.3f}", f"{off:.3f}", f"{on / off:.3f}")
                 for i, (on, off) in enumerate(zip(took["on"], took["off"]), 1)]))
    print(f"timing on / off = {ratio:.3f} (the rounds' median; their spread "
          f"{min(paired):.3f}-{max(paired):.3f}; goal <= 1.03)")
    # CPU time: the VM's neighbours move it far less than the wall clock
    cpu = statistics.median(on - off for on, off in zip(took["cpu on"], took["cpu off"]))
    share = cpu / statistics.median(took["cpu off"])
    print(f"timing's CPU a step = {cpu * 1e6:.1f} us, {100 * share:.2f}% of the process's CPU a "
          f"step without it (the rounds' median; the whole run's, every thread's: the epochs' "
          f"summaries and the trace, outside the epoch's clock, too)")
    return {"epoch_s": took, "ratios": {"timing on / off": ratio,
                                        "timing's CPU / the CPU without it": share}}


BENCHMARKS = {
    "timing": Benchmark(TIMING_DOC, TIMING_SPEC, timing_add_args, timing_run),
    "stop": Benchmark(STOP_DOC, STOP_SPEC, stop_add_args, stop_run),
    "start": Benchmark(START_DOC, START_SPEC, start_add_args, start_run, start_check),
    "tensorboard": Benchmark(TENSORBOARD_DOC, TENSORBOARD_SPEC, tensorboard_add_args, tensorboard_run),
}
