"""The sweep: for every op x implementation x group kind x size, warm up, time, check.

One measurement, all ranks in the same order: inputs reset (untimed) -> device sync -> global
barrier -> start -> the op on this rank's group -> stop -> result checked (untimed). A row's time
is its slowest group's median (docs/bench.md, "Sizes, timing, correctness").
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from tqdm import tqdm
from typing import Any, Callable, Iterable, Optional

import torch

from ..config.student import is_spec
from ..predict.costmodel import busbw_factor, pow2_label
from ..timing import percentile
from ..world.distributed import DistContext
from ..world.topology import build_groups, detect_topology, GroupSet, Topology
from .ops import GroupCtx, Op, OPS, Pattern, student_label, with_students


log = logging.getLogger("ddp_lab")


def log_sizes(lo: int, hi: int, points: int) -> list[int]:
    """`points` sizes evenly spaced on a log scale from lo to hi (inclusive), rounded to whole
    elements; distinct and ascending."""
    if points <= 1 or hi <= lo:
        return [hi if points == 1 else lo]
    a, b = math.log2(lo), math.log2(hi)
    out = [int(round(2 ** (a + i * (b - a) / (points - 1)))) for i in range(points)]
    return sorted(set(out))


def bench_sizes(bench: Any) -> list[int]:
    """The sizes a bench run measures: the log-spaced ones plus `bench.sizes`, ascending."""
    return sorted(set(log_sizes(bench.min_elements, bench.max_elements, bench.points))
                  | {int(s) for s in bench.get("sizes", None) or ()})


@dataclass
class Task:
    op: Op
    impl: str
    kind: str  # global | intra_node | cross_node | same_node / cross_node pairs (ping_pong)
    members: list[tuple[int, ...]]  # the groups (or the pair) that communicate
    mine: Optional[GroupCtx]  # this rank's group, None if it only waits at the barriers


def plan(bench: Any, topo: Topology, groups: dict[str, GroupSet], rank: int
         ) -> tuple[list[Task], list[str]]:
    """Tasks in run order and notes on what was skipped and why (the same on every rank)."""
    tasks: list[Task] = []
    notes: list[str] = []
    for name in bench.ops:
        op = with_students(OPS[name], list(bench.impl))
        names = [student_label(i) if is_spec(i) else i for i in bench.impl]
        impls = [i for i in names if i in op.impls]
        missing = [i for i in names if i not in op.impls]
        if missing:
            notes.append(f"{name}: no {'/'.join(missing)} implementation "
                         f"(it has {', '.join(op.impls)})")
        if op.pairwise:
            for kind, pair in topo.pairs().items():
                if pair is None:
                    why = "1 rank on node 0" if kind == "same_node" else f"{len(topo.nodes)} node"
                    notes.append(f"{name}/{kind}: no such pair of ranks ({why})")
                    continue
                mine = GroupCtx(pair, None, pair.index(rank)) if rank in pair else None
                tasks += [Task(op, i, kind, [pair], mine) for i in impls]
            continue
        for kind in bench.groups:
            gs = groups[kind]
            if not gs.measured:
                notes.append(f"{name}/{kind}: every {kind} group has 1 rank "
                             f"({topo.describe()}): nothing to measure, skipped")
                continue
            mine = GroupCtx(gs.ranks, gs.handle, gs.ranks.index(rank)) if len(gs.ranks) > 1 else None
            members = [gs.members[i] for i in gs.measured]
            if len(members) < len(gs.members):
                notes.append(f"{name}/{kind}: {len(gs.members) - len(members)} group(s) of "
                             "1 rank wait at the barrier")
            tasks += [Task(op, i, kind, members, mine) for i in impls]
    return tasks, notes


# --------------------------------------------------------------------------- memory
def free_bytes(ctx: DistContext) -> tuple[float, str]:
    """Bytes this rank may use for buffers before the fraction, and where that came from."""
    if ctx.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(ctx.device)
        return float(free), "free GPU memory"
    try:
        with open("/proc/meminfo") as f:
            avail = next(float(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        avail = float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return avail / max(ctx.env.local_world_size, 1), \
        f"available RAM / {ctx.env.local_world_size} local rank(s)"


def memory_caps(bench: Any, ctx: DistContext, element_size: int) -> tuple[dict[str, int], str]:
    """Largest size (elements) per op that fits on every rank, and a one-line account."""
    mine, where = free_bytes(ctx)
    usable = ctx.reduce_float(mine, "min") * bench.memory_fraction
    caps = {name: int(usable // (OPS[name].mem * element_size)) for name in bench.ops}
    return caps, (f"{human_bytes(usable)} per rank (bench.memory_fraction={bench.memory_fraction:g} "
                  f"of the {where})")


def human_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


# --------------------------------------------------------------------------- timing
def stopwatch(device: torch.device) -> Callable[[], float]:
    """Started now; the call it returns gives the seconds since. Host clock on CPU; CUDA events on
    GPU (a host clock would time the launch)."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        return lambda: time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()

    def stop() -> float:
        end.record()
        # wait for the collective's kernels to finish
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    return stop


def measure(task: Task, size: int, bench: Any, ctx: DistContext, pattern: Pattern,
            dtype: torch.dtype) -> dict:
    """Warm up, time and check one size on every rank; returns this rank's raw view."""
    g = task.mine
    run = task.op.impls[task.impl]
    bufs = task.op.setup(size, g, dtype, ctx.device) if g else None

    def once() -> float:
        if g:
            task.op.reset(bufs, g, pattern)
        # the reset's kernels are not part of the measurement
        ctx.synchronize()
        # load-bearing: every group starts at the same moment
        ctx.barrier()
        stop = stopwatch(ctx.device)
        if g:
            run(bufs, g)
        return stop()

    warm = [once() for _ in range(bench.warmup)]
    # every rank must run the same number of iterations: decide from the slowest rank
    t_warm = ctx.reduce_float(warm[-1] if warm else 0.0, "max")
    iters = bench.iters if t_warm <= 0 else int(bench.time_per_size_s / t_warm)
    iters = max(bench.min_iters, min(bench.iters, iters))
    times, error = [], None
    for _ in range(iters):
        times.append(once())
        if g and error is None:
            # every timed result, untimed
            error = task.op.check(bufs, g, pattern)
    del bufs
    return {"times": times, "error": error, "active": g is not None}


def summarise(task: Task, size: int, views: list[dict], dtype: torch.dtype) -> dict:
    """Rank 0: one row from every rank's view of a measurement."""
    per_group = []
    for ranks in task.members:
        iters = len(views[ranks[0]]["times"])
        t = [max(views[r]["times"][k] for r in ranks) for k in range(iters)]
        if task.op.pairwise:
            # one way = half the round trip
            t = [x / 2 for x in t]
        per_group.append((statistics.median(t), t, ranks))
    # the slowest group
    median, times, ranks = max(per_group)
    n = len(ranks)
    elements = task.op.elements(size, n)
    nbytes = elements * dtype.itemsize
    factor = busbw_factor(task.op.factor, n)
    algbw = nbytes / median / 1e9 if median > 0 else 0.0
    errors = [f"rank {r}: {v['error']}" for r, v in enumerate(views) if v["error"]]
    return {
        "op": task.op.name, "impl": task.impl, "group": task.kind, "group_size": n,
        "groups": len(task.members), "ranks": list(ranks), "elements": elements,
        "dtype": str(dtype).removeprefix("torch."), "bytes": nbytes, "iters": len(times),
        "time_median_s": median, "time_min_s": min(times), "time_max_s": max(times),
        "time_p25_s": percentile(times, 25), "time_p75_s": percentile(times, 75),
        "algbw_GBps": algbw, "busbw_factor": factor, "busbw_GBps": algbw * factor,
        # the assignment's throughput: bytes / 1024**3 / time (GiB/s), algbw in other units
        "throughput_GiBps": algbw * 1e9 / 2**30,
        "correct": not errors, "error": "; ".join(errors),
        "group_medians_s": [m for m, _, _ in per_group],
    }


def _line(row: dict) -> str:
    ok = "ok" if row["correct"] else "WRONG RESULT"
    return (f"{row['op']:<16} {row['impl']:<9} {row['group']:<10} n={row['group_size']:<3} "
            f"{pow2_label(row['elements']):>6} el  {row['time_median_s'] * 1e3:9.3f} ms  "
            f"algbw {row['algbw_GBps']:7.3f}  busbw {row['busbw_GBps']:7.3f} GB/s  {ok}")


def run_bench(bench: Any, ctx: DistContext, progress: str = "auto") -> dict:
    """The whole sweep on the initialised process group; rank 0 gets every row back."""
    env = ctx.env
    t_start = time.time()
    topo = detect_topology(ctx, bench.node_size)
    kinds = list(bench.groups)
    groups = build_groups(topo, kinds, env.rank)
    tasks, notes = plan(bench, topo, groups, env.rank)
    dtype = getattr(torch, bench.dtype)
    caps, mem_note = memory_caps(bench, ctx, dtype.itemsize)
    wanted = bench_sizes(bench)
    for name, cap in caps.items():
        dropped = [s for s in wanted if s > cap]
        if dropped:
            need = OPS[name].mem * dropped[0] * dtype.itemsize
            notes.append(f"{name}: sizes {', '.join(pow2_label(s) for s in dropped)} skipped: "
                         f"{pow2_label(dropped[0])} elements need ~{human_bytes(need)} per rank "
                         f"({OPS[name].mem:g} buffers), more than the {mem_note}")
    log.info("topology: %s; hosts: %s", topo.describe(), ", ".join(dict.fromkeys(topo.hosts)))
    for note in notes:
        log.info("note: %s", note)

    pattern = Pattern(dtype, ctx.device)
    # implementations of one op/group run back to back at each size, so that a drift in the
    # machine's load (a shared node, thermal throttling) hits them alike
    first: dict[tuple[str, str], int] = {}
    for i, t in enumerate(tasks):
        first.setdefault((t.op.name, t.kind), i)
    work = sorted(((first[(t.op.name, t.kind)], s, i, t) for i, t in enumerate(tasks)
                   for s in wanted if s <= caps[t.op.name]), key=lambda w: w[:3])
    # rank 0's bar (log.progress=bar, or auto on a terminal), else a line a row
    bar = tqdm(total=len(work), unit="size", dynamic_ncols=True, leave=False, disable=not (
        env.is_main and (progress == "bar" or (progress == "auto" and sys.stderr.isatty()))))
    rows: list[dict] = []
    for _, size, _, task in work:
        bar.set_description(f"{task.op.name} {task.impl} {task.kind} {pow2_label(size)}")
        view = measure(task, size, bench, ctx, pattern, dtype)
        views = ctx.gather_objects(view)
        if env.is_main:
            row = summarise(task, size, views, dtype)
            rows.append(row)
            bar.update()
            if bar.disable:
                log.info("%s", _line(row))
            elif not row["correct"]:
                bar.write(_line(row))
            if not row["correct"]:
                log.error("%s %s %s %d elements: wrong result: %s", row["op"], row["impl"],
                          row["group"], row["elements"], row["error"])
    bar.close()
    return {
        "rows": rows, "notes": notes, "memory": mem_note,
        "topology": {"nodes": [list(n) for n in topo.nodes], "hosts": list(topo.hosts),
                     "simulated": topo.simulated, "describe": topo.describe(),
                     "groups": {k: [list(m) for m in groups[k].members] for k in kinds}},
        "sizes": wanted, "duration_s": time.time() - t_start,
    }


def iter_series(rows: Iterable[dict]) -> dict[tuple[str, str, str], list[dict]]:
    """Rows by (op, impl, group), sizes ascending."""
    out: dict[tuple[str, str, str], list[dict]] = {}
    for r in rows:
        out.setdefault((r["op"], r["impl"], r["group"]), []).append(r)
    for v in out.values():
        v.sort(key=lambda r: r["elements"])
    return out
