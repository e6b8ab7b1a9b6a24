"""Epoch time of every synchroniser, side by side, measured in one run
(docs/sync.md, "Speed").

    python -m ddp_lab.bench.suite syncs                      # 2 ranks, CPU gloo
    python -m ddp_lab.bench.suite syncs --world 3 --rounds 7 --out bench.json

The notebook's workload, full epochs, the trainer's parts and step loop
(ddp_lab/bench/scaffold.py): a warm-up pass each, then `--rounds`
rotating rounds, each time the median of its rounds; then the timers'
cost step against step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from ...world.distributed import DistContext
from ...rank.epochs import EpochBatches
from ...step import run_steps
from ..scaffold import Bench, rank0, stamped_step
from ..suite import Spec, chosen, medians, ratios, rounds

# label -> its overrides on the trainer's config (the defaults: timing
# on)
CONFIGS = {
    "ddp": ["sync=ddp"],
    "ddp timing off": ["sync=ddp", "timing.enabled=false"],
    "allreduce": ["sync=allreduce"],
    "allreduce timing off": ["sync=allreduce", "timing.enabled=false"],
    "allreduce per-param": ["sync=allreduce", "sync.bucket_mb=0"],
    "reduce_broadcast": ["sync=reduce_broadcast"],
    "ring": ["sync=ring"],
    "ring timing off": ["sync=ring", "timing.enabled=false"],
    "ring prepost off": ["sync=ring", "sync.prepost=false"],
    "tree": ["sync=tree"],
    "butterfly": ["sync=butterfly"],
    # the textbook ring as a student's function: its send/recv watched
    # (docs/exercises.md, what the watch costs)
    "custom": ["sync=custom"],
}


SPEC = Spec(compares="every synchroniser (and ddp, allreduce, ring with their timers off), "
                     "full epochs of the trainer's step loop", rounds=5,
            ratios="each sync / ddp, per-param / bucketed, timing on / off, prepost off / on, "
                   "custom / ring")

#: configurations whose timer overhead is also measured step against
#: step (--paired)
PAIRED = ("ddp", "allreduce", "ring")


def worker(ctx: DistContext, args: argparse.Namespace) -> dict:
    bench = Bench(ctx, [f"data.root={args.data_root}"])
    n_steps = bench.steps(args.steps)
    cfgs = {label: bench.compose(ov) for label, ov in chosen(CONFIGS, args.only).items()}

    def one_epoch(label: str, epoch: int, steps: int) -> tuple[float, float | None]:
        parts = bench.parts(cfgs[label], epoch)
        elapsed = bench.epoch(parts, steps)
        steps_t, comm = parts.timer.collect(), parts.syncer.collect_comm()
        step_total = sum(sum(s.durations().values()) for s in steps_t)
        if not (parts.timer.enabled and step_total):
            return elapsed, None
        return elapsed, (comm.seconds / step_total, 1e3 * comm.seconds / steps)

    def paired(label: str, epoch: int, steps: int) -> tuple[list, list]:
        """One epoch with the timers switched on and off on alternate
        steps (both ranks alike): per-step wall times of each arm, free
        of the drift between epochs."""
        _, syncer, opt, timer = bench.parts(cfgs[label], epoch)
        batches, arms = iter(bench.splits.train), ([], [])
        ctx.barrier()
        for i in range(steps):
            on = (i + epoch) % 2 == 0
            timer.enabled = syncer.comm.enabled = on
            t = time.perf_counter()
            run_steps(syncer, opt, EpochBatches(batches, range(1), timer), timer)
            arms[0 if on else 1].append(time.perf_counter() - t)
        ctx.barrier()
        syncer.close()
        timer.collect(), syncer.collect_comm()
        return arms

    # warm-up: allocations, connections, caches
    for label in cfgs:
        one_epoch(label, 0, min(50, n_steps))
    times: dict[str, list[float]] = {label: [] for label in cfgs}
    fractions: dict[str, list[float]] = {label: [] for label in cfgs}
    for r, label in rounds(cfgs, args.rounds):
        t, frac = one_epoch(label, r, n_steps)
        times[label].append(t)
        if frac is not None:
            fractions[label].append(frac)
        if ctx.env.rank == 0:
            print(f"round {r}/{args.rounds}  {label:22s} {t:7.3f} s", flush=True)
    pairs: dict[str, tuple[list, list]] = {}
    if args.paired:
        for label, cfg in cfgs.items():
            if cfg.timing.enabled and label in PAIRED:
                on, off = pairs.setdefault(label, ([], []))
                for r in range(args.rounds):
                    a, b = paired(label, r + 1, n_steps)
                    on += a
                    off += b
    overhead = timer_overhead(n_steps) if ctx.env.rank == 0 else None
    return {"times": times, "fractions": fractions, "steps": n_steps,
            "timer_overhead_s": overhead, "paired": pairs}


def timer_overhead(steps: int, epochs: int = 20) -> float:
    """Seconds per step that the timers add: five phases, one timed
    collective and the per-epoch resolution, with empty bodies, timers
    on minus timers off (best of 5)."""
    import torch

    from ddp_lab.timing import Clock, CommRecorder, StepTimer, epoch_timing

    def run(enabled: bool) -> float:
        clock = Clock(torch.device("cpu"))
        timer, rec = StepTimer(clock, enabled), CommRecorder(clock, 2, enabled)
        t0 = time.perf_counter()
        for _ in range(epochs):
            for _ in range(steps):
                stamped_step(timer, rec)
            epoch_timing(timer.collect(), rec.collect())
        return (time.perf_counter() - t0) / (epochs * steps)

    return min(run(True) for _ in range(5)) - min(run(False) for _ in range(5))


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--world", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--steps", type=int, default=0, help="steps per epoch (0 = the full epoch)")
    ap.add_argument("--no-paired", dest="paired", action="store_false",
                    help="skip the paired timer measurement (timers on and off on alternate "
                         "steps of the same epochs, --rounds epochs per sync)")
    ap.add_argument("--only", default=None,
                    help="comma-separated configuration labels to run (default: all; the "
                         "ratios need ddp, allreduce, ring and their 'timing off' twins)")


def run(args: argparse.Namespace) -> dict | None:
    configs = chosen(CONFIGS, args.only)
    res = rank0(worker, args.world, args)
    if res is None:
        return None  # the rank's error is above
    med = medians(res["times"])
    spread = {k: (min(v), max(v)) for k, v in res["times"].items()}
    frac = {k: statistics.median(f for f, _ in v) if v else None for k, v in res["fractions"].items()}
    comm_ms = {k: statistics.median(c for _, c in v) if v else None for k, v in res["fractions"].items()}
    pairs = [("allreduce / ddp", "allreduce", "ddp"), ("ring / ddp", "ring", "ddp"),
             ("allreduce per-param / bucketed", "allreduce per-param", "allreduce"),
             ("ddp timing on / off", "ddp", "ddp timing off"),
             ("allreduce timing on / off", "allreduce", "allreduce timing off"),
             ("ring timing on / off", "ring", "ring timing off"),
             ("ring prepost off / on", "ring prepost off", "ring"),
             ("tree / ddp", "tree", "ddp"), ("butterfly / ddp", "butterfly", "ddp"),
             ("reduce_broadcast / ddp", "reduce_broadcast", "ddp"),
             ("custom / ring (the same ring, watched)", "custom", "ring")]
    ratio = ratios(med, pairs)
    print(f"\nworld {args.world}, CPU gloo, {res['steps']} steps/epoch of 64 per rank, "
          f"median of {args.rounds} rounds ({os.cpu_count()} CPUs)\n")
    print("| configuration | epoch time (s) | min - max (s) | vs ddp | comm share | comm (ms/step) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label in configs:
        f = (f"{100 * frac[label]:.0f}% | {comm_ms[label]:.2f}" if frac[label] is not None
             else "- | -")
        vs = f"{med[label] / med['ddp']:.2f}x" if "ddp" in med else "-"
        print(f"| {label} | {med[label]:.3f} | {spread[label][0]:.3f} - {spread[label][1]:.3f} "
              f"| {vs} | {f} |")
    over = res["timer_overhead_s"]
    if "ddp" in med:
        step = med["ddp"] / res["steps"]
        print(f"\ntimers alone: {over * 1e6:.1f} us/step = {100 * over / step:.2f}% of a ddp step "
              f"({step * 1e3:.2f} ms)")
    paired_out = {}
    if res["paired"]:
        print("\ntimers on / off, alternate steps of the same epochs (mean step time +- 2 "
              "standard errors of the difference; median step time):\n")
        print("| sync | steps per arm | mean on (ms) | mean off (ms) | on / off (mean) "
              "| on / off (median) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for label, (on, off) in res["paired"].items():
            m_on, m_off = statistics.fmean(on), statistics.fmean(off)
            se = (statistics.variance(on) / len(on) + statistics.variance(off) / len(off)) ** 0.5
            med_ratio = statistics.median(on) / statistics.median(off)
            paired_out[label] = {"on_ms": 1e3 * m_on, "off_ms": 1e3 * m_off,
                                 "ratio": m_on / m_off, "ratio_2se": 2 * se / m_off,
                                 "ratio_median": med_ratio}
            print(f"| {label} | {len(on)} | {1e3 * m_on:.3f} | {1e3 * m_off:.3f} | "
                  f"{m_on / m_off:.3f} +- {2 * se / m_off:.3f} | {med_ratio:.3f} |")
    return {"world": args.world, "rounds": args.rounds, "timers_paired": paired_out,
            "steps": res["steps"], "median_s": med, "times_s": res["times"],
            "comm_share": frac, "comm_ms_per_step": comm_ms,
            "timer_overhead_s_per_step": res["timer_overhead_s"], "ratios": ratio}
