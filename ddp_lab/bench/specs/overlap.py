"""Overlap on vs off, side by side in one run: DDP, allreduce+overlap,
allreduce (docs/compression_overlap.md, "Overlap and exposed comm").

    python -m ddp_lab.bench.suite overlap                 # mlp_wide, 2 ranks
    python -m ddp_lab.bench.suite overlap --only ddp,ring+overlap,ring

The same bucket size for all; a warm-up epoch each, then `--rounds`
rotating rounds, each figure the median over rounds, timed by the
trainer's step loop and timers.
"""

from __future__ import annotations

import argparse
import os

from ...world.distributed import DistContext
from ..scaffold import Bench, rank0
from ..suite import Spec, chosen, medians, ratios, rounds

# label -> (sync option, overlap)
CONFIGS = {
    "ddp": ("ddp", True),
    "allreduce+overlap": ("allreduce", True),
    "allreduce": ("allreduce", False),
    "ring+overlap": ("ring", True),
    "ring": ("ring", False),
}
DEFAULT = "ddp,allreduce+overlap,allreduce"
SPEC = Spec(compares="ddp, allreduce and ring with sync.overlap on and off, one bucket size",
            rounds=5, ratios="time per step: allreduce+overlap / ddp (target <= 1.1), "
                             "+overlap / without, ring+overlap / ddp")


def overrides(name: str, overlap: bool, bucket_mb: float) -> list[str]:
    """The trainer's overrides: the sync, its bucket size (DDP's own
    key), its overlap."""
    if name == "ddp":  # DDP always overlaps
        return ["sync=ddp", f"sync.bucket_cap_mb={bucket_mb}"]
    return [f"sync={name}", f"sync.bucket_mb={bucket_mb}", f"sync.overlap={str(overlap).lower()}"]


def worker(ctx: DistContext, args: argparse.Namespace) -> dict:
    bench = Bench(ctx, [f"data.root={args.data_root}", f"model={args.model}"])
    steps = bench.steps(args.steps)
    cfgs = {label: bench.compose(overrides(*c, args.bucket_mb))
            for label, c in chosen(CONFIGS, args.only).items()}

    def one_epoch(label: str, epoch: int, n: int) -> dict:
        return bench.split_epoch(cfgs[label], epoch, n)[0]

    # warm-up: allocations, connections, caches
    for label in cfgs:
        one_epoch(label, 0, min(5, steps))
    rows: dict[str, list[dict]] = {label: [] for label in cfgs}
    for r, label in rounds(cfgs, args.rounds):
        m = one_epoch(label, r, steps)
        rows[label].append(m)
        if ctx.env.rank == 0:
            print(f"round {r}/{args.rounds}  {label:18s} {m['step_ms']:8.1f} ms/step"
                  f"  exposed {m['exposed_ms']:7.1f}  in flight {m['inflight_ms']:7.1f}",
                  flush=True)
    return {"rows": rows, "steps": steps}


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--world", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--model", default="mlp_wide", help="model option (default mlp_wide)")
    ap.add_argument("--bucket-mb", type=float, default=4.0, help="bucket size, MB (default 4)")
    ap.add_argument("--steps", type=int, default=20, help="steps per epoch (default 20)")
    ap.add_argument("--only", default=DEFAULT,
                    help=f"configurations, comma-separated (default {DEFAULT}; also "
                         "ring+overlap, ring)")


def check(args: argparse.Namespace) -> None:
    # an unknown label: one line, before any rank starts
    chosen(CONFIGS, args.only)


def run(args: argparse.Namespace) -> dict | None:
    res = rank0(worker, args.world, args)
    if res is None:
        return None  # the rank's error is above
    med = medians(res["rows"])
    print(f"\n{args.model}, world {args.world}, CPU gloo, buckets {args.bucket_mb} MB, "
          f"{res['steps']} steps/epoch of 64 per rank, median of {args.rounds} rounds "
          f"({os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f})\n")
    print("| configuration | time/step (ms) | min - max | compute (ms) | exposed comm (ms) "
          "| in-flight comm (ms) | exposed / in-flight |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label in chosen(CONFIGS, args.only):
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
    return {"model": args.model, "world": args.world, "bucket_mb": args.bucket_mb,
            "steps": res["steps"], "median": med, "per_round": res["rows"], "ratios": ratio}
