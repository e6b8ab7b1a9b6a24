"""Straggler finding, checked against the truth: which measure names the late rank and how
well it gets its lateness (docs/timing.md, "Stragglers, injected and found").

    python -m ddp_lab.bench.suite straggler                        # 3 ranks, CPU gloo
    python -m ddp_lab.bench.suite straggler --world 3 --steps 300 --rounds 3 --slow-ms 5

The ranks of one machine share one clock (time.perf_counter), so each rank's true arrival at
each step's first collective is known; per (configuration, sync, round) the trainer's waits
and stamps are printed beside that truth.
"""

from __future__ import annotations

import argparse
import statistics
import time

from omegaconf import OmegaConf

from ...world.distributed import DistContext
from ...rank.delay import ComputeDelay
from ...timing import Clock, StragglerTally
from ..scaffold import Bench, rank0
from ..suite import Spec

SPEC = Spec(compares="nothing injected, one slow rank, jitter on every rank; each sync",
            rounds=3, ratios="the lateness each measure finds (waits, arrivals on the Clock) "
                             "against the truth and against the injected delay, minus 1")


def from_arrivals(arrivals: list[list[float]]) -> tuple[int, float, float]:
    """arrivals[rank][step] -> (the rank most often last, its share of steps, its median
    lead over the others in ms, over every step): the waits' rule, on arrival stamps."""
    n = len(arrivals)
    lasts, leads = [], [[] for _ in range(n)]
    for col in zip(*arrivals):
        lasts.append(max(range(n), key=col.__getitem__))
        for r in range(n):
            leads[r].append(statistics.median(col[r] - col[q] for q in range(n) if q != r))
    rank = max(range(n), key=lasts.count)
    return rank, lasts.count(rank) / len(lasts), 1e3 * statistics.median(leads[rank])


def worker(ctx: DistContext, args: argparse.Namespace) -> list:
    bench = Bench(ctx, [f"data.root={args.data_root}"])
    rank = ctx.env.rank
    configs = [("none", -1, 0.0, 0.0), (f"rank 1 +{args.slow_ms:g} ms", 1, args.slow_ms, 0.0),
               (f"jitter 0..{args.jitter_ms:g} ms", -1, 0.0, args.jitter_ms)]
    syncs = {name: bench.compose([f"sync={name}"]) for name in args.syncs.split(",")}
    rows = []
    for rnd in range(args.rounds + 1):  # round 0: warm-up, not reported
        for label, slow_rank, slow_ms, jitter_ms in configs:
            for name, cfg in syncs.items():
                debug = OmegaConf.create({"slow_rank": slow_rank, "slow_ms": slow_ms,
                                          "jitter_ms": jitter_ms})
                delay = ComputeDelay.from_config(debug, rank, rnd)
                slept: list[float] = []
                if delay is not None:
                    inner = delay

                    def delay(inner=inner) -> None:
                        t = time.perf_counter()
                        inner()
                        slept.append(time.perf_counter() - t)
                ctx.barrier()  # load-bearing: the Clock's zero, as train.py sets it
                clock = Clock(ctx.device)
                parts = bench.parts(cfg, rnd, clock=clock)
                bench.epoch(parts, args.steps if rnd else 30, delay=delay)
                st, comm = parts.timer.collect(), parts.syncer.collect_comm()
                starts = [s.start for s in st]
                first: list[float] = []  # each step's first collective (sorted by start)
                i = 0
                for s0 in starts:
                    while comm.timed[i].start < s0:
                        i += 1
                    first.append(comm.timed[i].start)
                mine = (clock.origin, comm.per_step_seconds(st), first,
                        statistics.median(slept) if slept else None)
                got = ctx.gather_objects(mine)
                if rank == 0 and rnd > 0:
                    rows.append((label, name, rnd, got))
    return rows


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--world", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300, help="steps per measurement")
    ap.add_argument("--slow-ms", type=float, default=5.0)
    ap.add_argument("--jitter-ms", type=float, default=5.0)
    ap.add_argument("--syncs", default="ddp,allreduce")


def run(args: argparse.Namespace) -> dict | None:
    rows = rank0(worker, args.world, args)
    if rows is None:
        return None  # the rank's error is above
    n = args.world
    print(f"world {n}, CPU gloo, {args.steps} steps each, MLP batch 64; lateness = the "
          "rank's median lead over the others (ms, every step); share = of steps it was last\n")
    print("| injected | sync | round | waits: named (late ms, share) | arrivals on Clock: last "
          "(late ms) | truth: last (late ms, share) | barrier exit skew (ms) | slept (ms) |")
    print("| --- | --- | ---: | --- | --- | --- | ---: | ---: |")
    errs: dict[str, list[float]] = {"waits vs truth": [], "arrivals vs truth": [],
                                    "waits vs injected": [], "truth vs injected": []}
    for label, name, rnd, got in rows:
        origins = [g[0] for g in got]
        tally = StragglerTally.from_waits([g[1] for g in got])
        named = tally.named()
        w_rank = max(range(n), key=tally.share)
        clock_arr = [g[2] for g in got]  # seconds on each rank's Clock (stamp - its zero)
        true_arr = [[a + o for a in arr] for arr, o in zip(clock_arr, origins)]  # shared clock
        c_rank, c_share, c_late = from_arrivals(clock_arr)
        t_rank, t_share, t_late = from_arrivals(true_arr)
        skew = 1e3 * (max(origins) - min(origins))
        slept = [g[3] for g in got if g[3] is not None]
        w_late = tally.late_ms(w_rank) or 0.0
        if label != "none" and not label.startswith("jitter"):
            errs["waits vs truth"].append(w_late / t_late - 1)
            errs["arrivals vs truth"].append(c_late / t_late - 1)
            errs["waits vs injected"].append(w_late / args.slow_ms - 1)
            errs["truth vs injected"].append(t_late / args.slow_ms - 1)
        named_s = (f"rank {named['rank']} ({named['late_ms']:.2f}, {named['share']:.0%})"
                   if named else f"none (rank {w_rank}: {w_late:.2f}, {tally.share(w_rank):.0%})")
        print(f"| {label} | {name} | {rnd} | {named_s} | rank {c_rank} ({c_late:.2f}, "
              f"{c_share:.0%}) | rank {t_rank} ({t_late:.2f}, {t_share:.0%}) | {skew:.3f} | "
              f"{'/'.join(f'{1e3 * s:.2f}' for s in slept) or '-'} |")
    print("\nerror of the lateness against the truth, injected rows (median, min..max):")
    for k, v in errs.items():
        if v:
            print(f"  {k:18s} {100 * statistics.median(v):+.1f}%  "
                  f"({100 * min(v):+.1f}% .. {100 * max(v):+.1f}%)")
    return {"errors": errs, "rows": len(rows),
            "ratios": {f"{k} (median)": statistics.median(v) for k, v in errs.items() if v}}
