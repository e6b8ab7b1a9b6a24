#!/usr/bin/env python
"""Overlap on vs off, side by side in one run: DDP, allreduce+overlap, allreduce.

    PYTHONPATH=. .venv/bin/python scripts/bench_overlap.py                 # mlp_wide, 2 ranks
    PYTHONPATH=. .venv/bin/python scripts/bench_overlap.py --bucket-mb 25 --steps 30 --repeats 7
    PYTHONPATH=. .venv/bin/python scripts/bench_overlap.py --only ddp,ring+overlap,ring

model=mlp_wide (784-2048x3-10, 10.0M parameters, 40 MB of gradients a step), batch 64 per
rank, CPU gloo. The same bucket size for all (`--bucket-mb`: DDP's `sync.bucket_cap_mb`,
our `sync.bucket_mb`; DDP caps its first bucket at 1 MB, its own rule). One process group
runs every configuration in turn, a warm-up epoch each, then `--repeats` rounds in a
rotating order (drift on a shared machine hits every configuration alike); each figure is
the median over rounds. The step loop is the trainer's (`ddp_lab.step.run_steps`) with
the trainer's timers (`StepTimer.watch_grads`: compute end, exposed and in-flight comm as
ddp_lab.timing defines them).

Prints per configuration: time per step (epoch wall time / steps), exposed and in-flight
comm (ms/step, rank 0), and the ratios allreduce+overlap / ddp (target <= 1.1) and
allreduce+overlap / allreduce. Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ddp_lab.bench.scaffold import (Bench, medians, parse_only, ratios, rounds, run_ranks,
                                   select)
from ddp_lab.distributed import DistContext
from ddp_lab.timing import epoch_timing

REPO = Path(__file__).resolve().parent.parent

# label -> (sync option, overlap)
CONFIGS = {
    "ddp": ("ddp", True),
    "allreduce+overlap": ("allreduce", True),
    "allreduce": ("allreduce", False),
    "ring+overlap": ("ring", True),
    "ring": ("ring", False),
}
DEFAULT = "ddp,allreduce+overlap,allreduce"


def overrides(name: str, overlap: bool, bucket_mb: float) -> list[str]:
    """The trainer's overrides: the sync, its bucket size (DDP's own key), its overlap."""
    if name == "ddp":  # DDP always overlaps
        return ["sync=ddp", f"sync.bucket_cap_mb={bucket_mb}"]
    return [f"sync={name}", f"sync.bucket_mb={bucket_mb}", f"sync.overlap={str(overlap).lower()}"]


def worker(ctx: DistContext, args: argparse.Namespace) -> dict:
    bench = Bench(ctx, [f"data.root={args.data_root}", f"model={args.model}"])
    steps = bench.steps(args.steps)
    cfgs = {label: bench.compose(overrides(*c, args.bucket_mb))
            for label, c in select(CONFIGS, args.only).items()}

    def one_epoch(label: str, epoch: int, n: int) -> dict:
        parts = bench.parts(cfgs[label], epoch, watch_grads=True)  # compute end, as trained
        elapsed = bench.epoch(parts, n)
        t = epoch_timing(parts.timer.collect(), comm := parts.syncer.take_comm())
        parts.timer.grads.remove()
        return {"step_ms": 1e3 * elapsed / n, "exposed_ms": 1e3 * t["exposed_s"] / n,
                "inflight_ms": 1e3 * comm.seconds / n, "compute_ms": 1e3 * t["compute_s"] / n}

    for label in cfgs:  # warm-up: allocations, connections, caches
        one_epoch(label, 0, min(5, steps))
    rows: dict[str, list[dict]] = {label: [] for label in cfgs}
    for r, label in rounds(cfgs, args.repeats):
        m = one_epoch(label, r, steps)
        rows[label].append(m)
        if ctx.env.rank == 0:
            print(f"round {r}/{args.repeats}  {label:18s} {m['step_ms']:8.1f} ms/step"
                  f"  exposed {m['exposed_ms']:7.1f}  in flight {m['inflight_ms']:7.1f}",
                  flush=True)
    return {"rows": rows, "steps": steps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--model", default="mlp_wide", help="model option (default mlp_wide)")
    ap.add_argument("--bucket-mb", type=float, default=4.0, help="bucket size, MB (default 4)")
    ap.add_argument("--steps", type=int, default=20, help="steps per epoch (default 20)")
    ap.add_argument("--repeats", type=int, default=5, help="measured rounds (default 5)")
    ap.add_argument("--only", default=DEFAULT,
                    help=f"configurations, comma-separated (default {DEFAULT}; also "
                         "ring+overlap, ring)")
    ap.add_argument("--data-root", default=str(REPO / "data"), help="MNIST folder")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args, configs = parse_only(ap, CONFIGS)

    results = run_ranks(worker, args.world, args)
    if results is None:
        return 1
    res = results[0]
    med = medians(res["rows"])
    print(f"\n{args.model}, world {args.world}, CPU gloo, buckets {args.bucket_mb} MB, "
          f"{res['steps']} steps/epoch of 64 per rank, median of {args.repeats} rounds "
          f"({os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f})\n")
    print("| configuration | time/step (ms) | min - max | compute (ms) | exposed comm (ms) "
          "| in-flight comm (ms) | exposed / in-flight |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label in configs:
        m, ms = med[label], [x["step_ms"] for x in res["rows"][label]]
        share = m["exposed_ms"] / m["inflight_ms"] if m["inflight_ms"] else float("nan")
        print(f"| {label} | {m['step_ms']:.1f} | {min(ms):.1f} - {max(ms):.1f} "
              f"| {m['compute_ms']:.1f} | {m['exposed_ms']:.1f} | {m['inflight_ms']:.1f} "
              f"| {share:.2f} |")
    pairs = [("allreduce+overlap / ddp", "allreduce+overlap", "ddp"),
             ("allreduce+overlap / allreduce", "allreduce+overlap", "allreduce"),
             ("ring+overlap / ddp", "ring+overlap", "ddp"),
             ("ring+overlap / ring", "ring+overlap", "ring")]
    ratio = ratios({label: m["step_ms"] for label, m in med.items()}, pairs)
    print("\n| ratio of time per step | measured |\n| --- | ---: |")
    for k, v in ratio.items():
        print(f"| {k} | {v:.3f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "model": args.model, "world": args.world, "bucket_mb": args.bucket_mb,
            "steps": res["steps"], "repeats": args.repeats, "median": med,
            "rounds": res["rows"], "ratios": ratio}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
