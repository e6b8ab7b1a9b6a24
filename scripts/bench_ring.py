"""Micro-benchmark: ring all-reduce from ddp_lab.collectives vs torch.distributed.all_reduce.

Spawns ``--world-size`` gloo ranks on this machine (CPU tensors, float32) and, for each
size 2^min_exp .. 2^max_exp elements, times the algorithms *interleaved* (a, b, a, b, ...)
so load drift hits both alike; each timed call starts right after a barrier. Reports rank
0's median time, the nccl-tests bus bandwidth

    busbw = nbytes / seconds * 2(n-1)/n        (GB/s = 1e9 bytes/s)

and "<algo> vs torch": the median over iterations of t_torch / t_algo for the pair of
calls made back to back (= busbw ratio; > 1 means faster than torch).

Example::

    PYTHONPATH=. python scripts/bench_ring.py               # 2 ranks, 2^20..2^24
    PYTHONPATH=. python scripts/bench_ring.py --algos ring,butterfly,torch --iters 9
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddp_lab.collectives import ALL_REDUCE, DEFAULT_SEGMENT_BYTES
from ddp_lab.costmodel import busbw_factor


def _worker(rank: int, args: argparse.Namespace, init_file: str, queue) -> None:
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=args.world_size, timeout=datetime.timedelta(seconds=120))
    n = args.world_size
    algos = args.algos.split(",")
    seg = None if args.segment_bytes <= 0 else args.segment_bytes
    kwargs = {a: ({"segment_bytes": seg} if a == "ring" else {}) for a in algos}
    rows = []
    for exp in range(args.min_exp, args.max_exp + 1):
        numel = 1 << exp
        gen = torch.Generator().manual_seed(rank)
        data = torch.randn(numel, generator=gen)
        # Correctness first: every algorithm must agree with torch on this size.
        want = data.clone()
        dist.all_reduce(want)
        for algo in algos:
            got = data.clone()
            ALL_REDUCE[algo](got, **kwargs[algo])
            if not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
                raise AssertionError(f"{algo} all-reduce disagrees with torch at 2^{exp}")
        bufs = {algo: data.clone() for algo in algos}
        times: dict[str, list[float]] = {algo: [] for algo in algos}
        for it in range(args.warmup + args.iters):
            for algo in algos:
                dist.barrier()
                t0 = time.perf_counter()
                ALL_REDUCE[algo](bufs[algo], **kwargs[algo])
                dt = time.perf_counter() - t0
                if it >= args.warmup:
                    times[algo].append(dt)
                bufs[algo].copy_(data)  # keep values bounded
        medians = {a: statistics.median(ts) for a, ts in times.items()}
        # Paired ratio: torch/algo per iteration (the two ran back to back), then median;
        # much less sensitive to load drift than a ratio of medians.
        paired = {a: statistics.median(t / x for t, x in zip(times["torch"], times[a]))
                  for a in algos if a != "torch" and "torch" in algos}
        rows.append((numel, medians, paired))
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--min-exp", type=int, default=20)
    ap.add_argument("--max-exp", type=int, default=24)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    ap.add_argument("--segment-bytes", type=int, default=DEFAULT_SEGMENT_BYTES,
                    help="ring message piece size in bytes (<= 0: send each chunk whole)")
    ap.add_argument("--algos", default="ring,torch",
                    help=f"comma-separated ALL_REDUCE names; known: {','.join(ALL_REDUCE)}")
    args = ap.parse_args()
    for algo in args.algos.split(","):
        if algo not in ALL_REDUCE:
            ap.error(f"unknown algorithm {algo!r}; known: {', '.join(ALL_REDUCE)}")

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(args, os.path.join(tmp, "store"), queue), nprocs=args.world_size)
    rows = queue.get()

    n = args.world_size
    factor = busbw_factor("all_reduce", n)
    algos = args.algos.split(",")
    print(f"all-reduce, gloo, {n} ranks, float32, median of {args.iters} "
          f"(after {args.warmup} warm-up), busbw = bytes/time * 2(n-1)/n, GB/s = 1e9 B/s, "
          f"ring segment_bytes={args.segment_bytes}")
    head = f"{'elements':>10} {'MB':>7}"
    for algo in algos:
        head += f" {algo + ' ms':>10} {algo + ' GB/s':>11}"
    if "torch" in algos and len(algos) > 1:
        head += "".join(f" {a + ' vs torch':>14}" for a in algos if a != "torch")
    print(head)
    for numel, med, paired in rows:
        nbytes = numel * 4
        line = f"{numel:>10} {nbytes / 1e6:>7.1f}"
        for algo in algos:
            line += f" {med[algo] * 1e3:>10.2f} {nbytes / med[algo] * factor / 1e9:>11.3f}"
        if "torch" in algos and len(algos) > 1:
            line += "".join(f" {paired[a]:>14.2f}" for a in algos if a != "torch")
        print(line)


if __name__ == "__main__":
    main()
