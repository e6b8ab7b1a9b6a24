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
the median over rounds. The step loop is the trainer's (`ddp_lab.train.run_steps`) with
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
import statistics
import sys
import time
from pathlib import Path

from ddp_lab.ports import free_port

REPO = Path(__file__).resolve().parent.parent

# (label, sync option, overlap)
CONFIGS = [
    ("ddp", "ddp", True),
    ("allreduce+overlap", "allreduce", True),
    ("allreduce", "allreduce", False),
    ("ring+overlap", "ring", True),
    ("ring", "ring", False),
]
DEFAULT = "ddp,allreduce+overlap,allreduce"


def selected(only: str) -> list[tuple]:
    keep = [c.strip() for c in only.split(",")]
    unknown = set(keep) - {c[0] for c in CONFIGS}
    if unknown:
        raise ValueError(f"unknown configuration(s) {sorted(unknown)}: choose from "
                         f"{[c[0] for c in CONFIGS]}")
    return [c for c in CONFIGS if c[0] in keep]


def worker(rank: int, world: int, port: int, args: argparse.Namespace, queue) -> None:
    import torch
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from ddp_lab.config import compose
    from ddp_lab.data import build_splits, prepare_mnist
    from ddp_lab.distributed import local_gloo_world
    from ddp_lab.models import build_model, build_optimizer
    from ddp_lab.sync import build_sync
    from ddp_lab.timing import Clock, StepTimer, epoch_timing
    from ddp_lab.train import run_steps

    ctx = local_gloo_world(rank, world, port)
    env, device = ctx.env, ctx.device
    try:
        cfg = compose([f"data.root={args.data_root}", f"model={args.model}"])
        prepare_mnist(cfg.data.root, list(cfg.data.mirrors), ctx, False)
        splits = build_splits(cfg.data, cfg.train, env, device)
        steps = min(args.steps, len(splits.train))
        clock = Clock(device)
        configs = selected(args.only)

        def one_epoch(name: str, overlap: bool, epoch: int, n: int) -> dict:
            key = "bucket_cap_mb" if name == "ddp" else "bucket_mb"
            over = [f"sync={name}", f"sync.{key}={args.bucket_mb}"]
            if name != "ddp":
                over.append(f"sync.overlap={str(overlap).lower()}")
            sync_cfg = compose(over).sync
            torch.manual_seed(cfg.train.seed)
            module = build_model(cfg.model).to(device)
            syncer = build_sync(sync_cfg, module, device, world, clock=clock)
            opt = build_optimizer(cfg.optim, module.parameters(), cfg.train.lr)
            timer = StepTimer(clock)
            timer.watch_grads(module)
            splits.train.set_epoch(epoch)
            dist.barrier()  # load-bearing: all ranks start together
            t0 = time.perf_counter()
            run_steps(syncer, opt, iter(splits.train), range(n), timer)
            dist.barrier()  # load-bearing: the epoch ends when the slowest rank ends
            elapsed = time.perf_counter() - t0
            syncer.close()
            t = epoch_timing(timer.collect(), comm := syncer.take_comm())
            timer.grads.remove()
            return {"step_ms": 1e3 * elapsed / n, "exposed_ms": 1e3 * t["exposed_s"] / n,
                    "inflight_ms": 1e3 * comm.seconds / n, "compute_ms": 1e3 * t["compute_s"] / n}

        for _, name, overlap in configs:  # warm-up: allocations, connections, caches
            one_epoch(name, overlap, 0, min(5, steps))
        rows: dict[str, list[dict]] = {c[0]: [] for c in configs}
        for r in range(args.repeats):
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            for label, name, overlap in order:
                m = one_epoch(name, overlap, r + 1, steps)
                rows[label].append(m)
                if rank == 0:
                    print(f"round {r + 1}/{args.repeats}  {label:18s} {m['step_ms']:8.1f} ms/step"
                          f"  exposed {m['exposed_ms']:7.1f}  in flight {m['inflight_ms']:7.1f}",
                          flush=True)
        queue.put((rank, {"rows": rows, "steps": steps}))
    except BaseException as e:  # noqa: BLE001 -- reported by the parent
        queue.put((rank, f"{type(e).__name__}: {e}"))
        raise
    finally:
        dist.destroy_process_group()


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
    args = ap.parse_args()
    try:
        configs = selected(args.only)
    except ValueError as e:
        ap.error(str(e))

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, args.world, port, args, queue))
             for r in range(args.world)]
    for p in procs:
        p.start()
    results = {}
    for _ in procs:
        rank, out = queue.get(timeout=3600)
        if isinstance(out, str):
            print(f"rank {rank} failed: {out}", file=sys.stderr)
            return 1
        results[rank] = out
    for p in procs:
        p.join()
    res = results[0]
    med = {label: {k: statistics.median(m[k] for m in ms) for k in ms[0]}
           for label, ms in res["rows"].items()}
    print(f"\n{args.model}, world {args.world}, CPU gloo, buckets {args.bucket_mb} MB, "
          f"{res['steps']} steps/epoch of 64 per rank, median of {args.repeats} rounds "
          f"({os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f})\n")
    print("| configuration | time/step (ms) | min - max | compute (ms) | exposed comm (ms) "
          "| in-flight comm (ms) | exposed / in-flight |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, *_ in configs:
        m, ms = med[label], [x["step_ms"] for x in res["rows"][label]]
        share = m["exposed_ms"] / m["inflight_ms"] if m["inflight_ms"] else float("nan")
        print(f"| {label} | {m['step_ms']:.1f} | {min(ms):.1f} - {max(ms):.1f} "
              f"| {m['compute_ms']:.1f} | {m['exposed_ms']:.1f} | {m['inflight_ms']:.1f} "
              f"| {share:.2f} |")
    pairs = [("allreduce+overlap / ddp", "allreduce+overlap", "ddp"),
             ("allreduce+overlap / allreduce", "allreduce+overlap", "allreduce"),
             ("ring+overlap / ddp", "ring+overlap", "ddp"),
             ("ring+overlap / ring", "ring+overlap", "ring")]
    ratios = {k: med[a]["step_ms"] / med[b]["step_ms"] for k, a, b in pairs
              if a in med and b in med}
    print("\n| ratio of time per step | measured |\n| --- | ---: |")
    for k, v in ratios.items():
        print(f"| {k} | {v:.3f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "model": args.model, "world": args.world, "bucket_mb": args.bucket_mb,
            "steps": res["steps"], "repeats": args.repeats, "median": med,
            "rounds": res["rows"], "ratios": ratios}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
