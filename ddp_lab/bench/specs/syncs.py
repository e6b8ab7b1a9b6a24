"""The training benchmarks of the synchronisers, side by side: every synchroniser's time per step
(syncs), overlap on and off (overlap), gradient compression (compress) and the hierarchical
all-reduce (hierarchical); each described by its `*_DOC`."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ...rank.epochs import EpochBatches
from ...step import run_steps
from ...world.distributed import DistContext
from ..scaffold import Bench, run_ranks, stamped_step
from ..suite import Benchmark, medians, ratios, side_by_side, Spec, table, trained, with_bucket


# ------------------------------------------------------------------ syncs
SYNCS_DOC = """Epoch time of every synchroniser, side by side, measured in one run
(docs/sync.md, "Speed").

    python -m ddp_lab.bench.suite syncs                      # 2 ranks, CPU gloo
    python -m ddp_lab.bench.suite syncs --world 3 --rounds 7 --out bench.json

The notebook's workload, full epochs, the trainer's parts and step loop
(ddp_lab/bench/scaffold.py): a warm-up pass each, then `--rounds` rotating rounds, each time the
median of its rounds; then the timers' cost step against step.
"""

# label -> its overrides on the trainer's config (the defaults: timing on)
SYNCS_CONFIGS = {
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
          # the textbook ring as a student's function: its send/recv watched (docs/exercises.md,
          # what the watch costs)
          "custom": ["sync=custom"],
}


SYNCS_SPEC = Spec(compares="every synchroniser (and ddp, allreduce, ring with their timers off), "
                           "full epochs of the trainer's step loop", rounds=5,
                  ratios="each sync / ddp, per-param / bucketed, timing on / off, prepost off / on, "
                         "custom / ring", world=2, steps=0, configs=SYNCS_CONFIGS)

#: configurations whose timer overhead is also measured step against step (--paired)
PAIRED = ("ddp", "allreduce", "ring")


def syncs_worker(ctx: DistContext, args: argparse.Namespace) -> dict:
    bench = Bench(ctx, [f"data.root={args.data_root}"])
    n_steps = bench.steps(args.steps)
    cfgs = {label: bench.compose(ov) for label, ov in args.configs.items()}

    def one_epoch(label: str, epoch: int, steps: int) -> tuple[float, float | None]:
        parts = bench.parts(cfgs[label], epoch)
        elapsed = bench.epoch(parts, steps)
        steps_t, comm = parts.timer.collect(), parts.syncer.collect_comm()
        step_total = sum(sum(s.durations().values()) for s in steps_t)
        if not (parts.timer.enabled and step_total):
            return elapsed, None
        return elapsed, (comm.seconds / step_total, 1e3 * comm.seconds / steps)

    def paired(label: str, epoch: int, steps: int) -> tuple[list, list]:
        """One epoch with the timers switched on and off on alternate steps (both ranks alike):
        per-step wall times of each arm, free of the drift between epochs."""
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
    got = side_by_side(list(cfgs), args.rounds, lambda label, r: one_epoch(label, r, n_steps),
                       (lambda r, label, x: f"round {r}/{args.rounds}  {label:22s} {x[0]:7.3f} s")
                       if ctx.env.rank == 0 else None)
    times = {label: [t for t, _ in v] for label, v in got.items()}
    fractions = {label: [f for _, f in v if f is not None] for label, v in got.items()}
    pairs: dict[str, tuple[list, list]] = {}
    for label in (lb for lb in cfgs if args.paired and lb in PAIRED and cfgs[lb].timing.enabled):
        arms = [paired(label, r + 1, n_steps) for r in range(args.rounds)]
        pairs[label] = ([t for on, _ in arms for t in on], [t for _, off in arms for t in off])
    overhead = timer_overhead(n_steps) if ctx.env.rank == 0 else None
    return {"times": times, "fractions": fractions, "steps": n_steps,
            "timer_overhead_s": overhead, "paired": pairs}


def timer_overhead(steps: int, epochs: int = 20) -> float:
    """Seconds per step that the timers add: five phases, one timed collective and the per-epoch
    resolution, with empty bodies, timers on minus timers off (best of 5)."""
    import torch

    from ddp_lab.timing import Clock, CommRecorder, StepTimer, epoch_timing

    def per_step(enabled: bool) -> float:
        clock = Clock(torch.device("cpu"))
        timer, rec = StepTimer(clock, enabled), CommRecorder(clock, 2, enabled)
        t0 = time.perf_counter()
        for _ in range(epochs):
            for _ in range(steps):
                stamped_step(timer, rec)
            epoch_timing(timer.collect(), rec.collect())
        return (time.perf_counter() - t0) / (epochs * steps)

    return min(per_step(True) for _ in range(5)) - min(per_step(False) for _ in range(5))


def syncs_add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--no-paired", dest="paired", action="store_false",
                    help="skip the paired timer measurement (timers on and off on alternate "
                         "steps of the same epochs, --rounds epochs per sync)")


def syncs_run(args: argparse.Namespace) -> dict:
    res = run_ranks(syncs_worker, args.world, args)[0]
    med = medians(res["times"])
    spread = {k: (min(v), max(v)) for k, v in res["times"].items()}
    frac = {k: statistics.median(f for f, _ in v) if v else None for k, v in res["fractions"].items()}
    comm_ms = {k: statistics.median(c for _, c in v) if v else None for k, v in res["fractions"].items()}
    pairs = [("allreduce / ddp", "allreduce", "ddp"), ("ring / ddp", "ring", "ddp"),
             ("allreduce per-param / bucketed", "allreduce per-param", "allreduce"),
             *((f"{s} timing on / off", s, f"{s} timing off")
               for s in ("ddp", "allreduce", "ring")),
             ("ring prepost off / on", "ring prepost off", "ring"),
             *((f"{s} / ddp", s, "ddp") for s in ("tree", "butterfly", "reduce_broadcast")),
             ("custom / ring (the same ring, watched)", "custom", "ring")]
    ratio = ratios(med, pairs)
    print(f"\nworld {args.world}, CPU gloo, {res['steps']} steps/epoch of 64 per rank, "
          f"median of {args.rounds} rounds ({os.cpu_count()} CPUs)\n")
    print(table(["configuration", "epoch time (s)", "min - max (s)", "vs ddp", "comm share",
                 "comm (ms/step)"],
                [(label, f"{med[label]:.3f}", f"{spread[label][0]:.3f} - {spread[label][1]:.3f}",
                  f"{med[label] / med['ddp']:.2f}x" if "ddp" in med else "-",
                  *((f"{100 * frac[label]:.0f}%", f"{comm_ms[label]:.2f}")
                    if frac[label] is not None else ("-", "-"))) for label in args.configs]))
    over = res["timer_overhead_s"]
    if "ddp" in med:
        step = med["ddp"] / res["steps"]
        print(f"\ntimers alone: {over * 1e6:.1f} us/step = {100 * over / step:.2f}% of a ddp step "
              f"({step * 1e3:.2f} ms)")
    paired_out = {}
    if res["paired"]:
        print("\ntimers on / off, alternate steps of the same epochs (mean step time +- 2 "
              "standard errors of the difference; median step time):\n")
        rows = []
        for label, (on, off) in res["paired"].items():
            m_on, m_off = statistics.fmean(on), statistics.fmean(off)
            se = (statistics.variance(on) / len(on) + statistics.variance(off) / len(off)) ** 0.5
            med_ratio = statistics.median(on) / statistics.median(off)
            paired_out[label] = {"on_ms": 1e3 * m_on, "off_ms": 1e3 * m_off,
                                 "ratio": m_on / m_off, "ratio_2se": 2 * se / m_off,
                                 "ratio_median": med_ratio}
            rows.append((label, len(on), f"{1e3 * m_on:.3f}", f"{1e3 * m_off:.3f}",
                         f"{m_on / m_off:.3f} +- {2 * se / m_off:.3f}", f"{med_ratio:.3f}"))
        print(table(["sync", "steps per arm", "mean on (ms)", "mean off (ms)", "on / off (mean)",
                     "on / off (median)"], rows))
    return {"world": args.world, "rounds": args.rounds, "timers_paired": paired_out,
            "steps": res["steps"], "median_s": med, "times_s": res["times"],
            "comm_share": frac, "comm_ms_per_step": comm_ms,
            "timer_overhead_s_per_step": res["timer_overhead_s"], "ratios": ratio}


# ------------------------------------------------------------------ overlap
OVERLAP_DOC = """Overlap on vs off, side by side in one run: DDP, allreduce+overlap,
allreduce (docs/compression_overlap.md, "Overlap and exposed comm").

    python -m ddp_lab.bench.suite overlap                 # mlp_wide, 2 ranks
    python -m ddp_lab.bench.suite overlap --only ddp,ring+overlap,ring

The same bucket size for all; a warm-up epoch each, then `--rounds` rotating rounds, each figure
the median over rounds, timed by the trainer's step loop and timers.
"""

# label -> the sync's overrides (DDP always overlaps)
OVERLAP_CONFIGS = {
            "ddp": ["sync=ddp"],
            "allreduce+overlap": ["sync=allreduce", "sync.overlap=true"],
            "allreduce": ["sync=allreduce", "sync.overlap=false"],
            "ring+overlap": ["sync=ring", "sync.overlap=true"],
            "ring": ["sync=ring", "sync.overlap=false"],
}
OVERLAP_SPEC = Spec(compares="ddp, allreduce and ring with sync.overlap on and off, one bucket size",
                    rounds=5, ratios="time per step: allreduce+overlap / ddp (target <= 1.1), "
                                     "+overlap / without, ring+overlap / ddp",
                    world=2, steps=20, configs=OVERLAP_CONFIGS, only="ddp,allreduce+overlap,allreduce")


def overlap_worker(ctx: DistContext, args: argparse.Namespace) -> dict:
    bench = Bench(ctx, [f"data.root={args.data_root}", f"model={args.model}"])
    steps = bench.steps(args.steps)
    cfgs = {label: bench.compose(with_bucket(ov, args.bucket_mb))
            for label, ov in args.configs.items()}
    # warm-up: allocations, connections, caches
    for cfg in cfgs.values():
        bench.split_epoch(cfg, 0, min(5, steps))
    rows = side_by_side(list(cfgs), args.rounds,
                        lambda label, r: bench.split_epoch(cfgs[label], r, steps)[0],
                        (lambda r, label, m: f"round {r}/{args.rounds}  {label:18s} "
                         f"{m['step_ms']:8.1f} ms/step  exposed {m['exposed_ms']:7.1f}  in flight "
                         f"{m['inflight_ms']:7.1f}") if ctx.env.rank == 0 else None)
    return {"rows": rows, "steps": steps}


def overlap_add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="mlp_wide", help="model option (default mlp_wide)")
    ap.add_argument("--bucket-mb", type=float, default=4.0, help="bucket size, MB (default 4)")


def overlap_run(args: argparse.Namespace) -> dict:
    res = run_ranks(overlap_worker, args.world, args)[0]
    med = medians(res["rows"])
    print(f"\n{args.model}, world {args.world}, CPU gloo, buckets {args.bucket_mb} MB, "
          f"{res['steps']} steps/epoch of 64 per rank, median of {args.rounds} rounds "
          f"({os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f})\n")
    rows = []
    for label, m in med.items():
        ms = [x["step_ms"] for x in res["rows"][label]]
        share = m["exposed_ms"] / m["inflight_ms"] if m["inflight_ms"] else float("nan")
        rows.append((label, f"{m['step_ms']:.1f}", f"{min(ms):.1f} - {max(ms):.1f}",
                     *(f"{m[k]:.1f}" for k in ("compute_ms", "exposed_ms", "inflight_ms")),
                     f"{share:.2f}"))
    print(table(["configuration", "time/step (ms)", "min - max", "compute (ms)",
                 "exposed comm (ms)", "in-flight comm (ms)", "exposed / in-flight"], rows))
    pairs = [("allreduce+overlap / ddp", "allreduce+overlap", "ddp"),
             ("allreduce+overlap / allreduce", "allreduce+overlap", "allreduce"),
             ("ring+overlap / ddp", "ring+overlap", "ddp"),
             ("ring+overlap / ring", "ring+overlap", "ring")]
    ratio = ratios({label: m["step_ms"] for label, m in med.items()}, pairs)
    return {"model": args.model, "world": args.world, "bucket_mb": args.bucket_mb,
            "steps": res["steps"], "median": med, "per_round": res["rows"], "ratios": ratio}


# ------------------------------------------------------------------ compress
COMPRESS_DOC = """Gradient compression (sync.compress): bytes, time per epoch and
accuracy, side by side (docs/compression_overlap.md, "What it buys").

    python -m ddp_lab.bench.suite compress                              # mlp, 5 epochs
    python -m ddp_lab.bench.suite compress --only "ddp none,ddp fp16" --rounds 3

Each configuration is one real training run, rounds in rotating order; each figure with its ratio
to the uncompressed run of the same synchroniser.
"""

#: "synchroniser sync.compress": ddp through torch's hooks, ring (ours) through _reduce
COMPRESS_CONFIGS = {f"{s} {c}": (s, c) for s, c in [
             ("ddp", "none"), ("ddp", "fp16"), ("ddp", "bf16"), ("ddp", "powersgd"),
             ("ring", "none"), ("ring", "fp16"), ("ring", "bf16")]}
COMPRESS_SPEC = Spec(compares="ddp and ring, each uncompressed, fp16, bf16 (and ddp powersgd): "
                              "whole training runs", rounds=1,
                     ratios="bytes sent / step and epoch time, each / the same sync uncompressed",
                     world=2, configs=COMPRESS_CONFIGS)


def compress_add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--max-steps", type=int, default=0, help="train.max_steps_per_epoch (0 = all)")
    ap.add_argument("override", nargs="*", help="more overrides for every run")


def compress_run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_compress_") as tmp:
        def one(label: str, r: int) -> dict:
            sync, compress = args.configs[label]
            s = trained([f"sync={sync}", f"sync.compress={compress}", f"model={args.model}",
                         f"launcher.nproc_per_node={args.world}", f"train.epochs={args.epochs}",
                         f"train.max_steps_per_epoch={args.max_steps}",
                         f"data.root={args.data_root}", f"run.root={tmp}", *args.override], tmp)
            got = {"sent_per_step": s["comm_bytes_sent"] / s["steps_run"],
                   "epoch_s": s["epoch_time_s_median"], "accuracy": s["test_accuracy"],
                   "comm_ms_per_step": 1e3 * (s["comm_time_s"] or 0) / s["steps_run"]}
            print(f"  {label}: {got}", file=sys.stderr, flush=True)
            return got

        rows = side_by_side(list(args.configs), args.rounds, one)
    med = medians(rows)
    print(f"{args.model}, {args.world} ranks (gloo), {args.epochs} epochs"
          f"{f' of {args.max_steps} steps' if args.max_steps else ''}, "
          f"median of {args.rounds} run(s) each; ratio = / the same sync uncompressed\n")
    found, lines = {}, []
    for label, m in med.items():
        sync, compress = args.configs[label]
        base = med.get(f"{sync} none")
        ratio = (lambda k: f"{m[k] / base[k]:.3f}" if base and base[k] else "-")
        lines.append((sync, compress, f"{m['sent_per_step']:,.0f}", ratio("sent_per_step"),
                      f"{m['comm_ms_per_step']:.2f}", f"{m['epoch_s']:.3f}", ratio("epoch_s"),
                      f"{m['accuracy']:.4f}",
                      f"{m['accuracy'] - base['accuracy']:+.4f}" if base else "-"))
        if base and compress != "none":
            found[f"{label} / none: bytes"] = m["sent_per_step"] / base["sent_per_step"]
            found[f"{label} / none: epoch"] = m["epoch_s"] / base["epoch_s"]
    print(table(["sync", "compress", "bytes sent / step", "ratio", "comm ms / step", "epoch s",
                 "ratio", "test accuracy", "difference"], lines, "ll" + "r" * 7))
    return {"runs": rows, "ratios": found}


# ------------------------------------------------------------------ hierarchical
HIERARCHICAL_DOC = """Hierarchical all-reduce against the flat ones, side by side, measured
in one run (docs/sync.md, "Hierarchical").

    # one machine, 4 ranks as 2 pretend nodes (the flat syncs ignore sync.node_size)
    python -m ddp_lab.bench.suite hierarchical --node-size 2 -- launcher.nproc_per_node=4

Each configuration is a real `python -m ddp_lab` run (1 epoch of `--steps` steps, the overrides
after `--` added), in rotating order; printed from rank 0's summary.json: epoch and comm time, MB
sent (and to another node) per step, each variant's ratio to ring and ddp.
"""

# label -> overrides
HIERARCHICAL_CONFIGS = {
                 "ddp": ["sync=ddp"],
                 "ring": ["sync=ring"],
                 "hierarchical inter=ring": ["sync=hierarchical", "sync.inter=ring"],
                 "hierarchical inter=library": ["sync=hierarchical", "sync.inter=library"],
}
HIERARCHICAL_SPEC = Spec(compares="ddp, ring and sync=hierarchical (ring or the library between nodes), "
                                  "whole 1-epoch runs", rounds=2, data=False,
                         ratios="each hierarchical variant / ring and / ddp: epoch, comm per step",
                         steps=20, configs=HIERARCHICAL_CONFIGS)


def hierarchical_add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--node-size", type=int, default=0, help="sync.node_size for hierarchical")
    ap.add_argument("--root", type=Path, default=Path("outputs/bench_hierarchical"),
                    help="run folders under this folder")
    ap.add_argument("overrides", nargs="*", help="ddp_lab overrides for every run (after --)")


def hierarchical_run(args: argparse.Namespace) -> dict:
    root = args.root.resolve()
    common = ["train.epochs=1", f"train.max_steps_per_epoch={args.steps}",
              "train.checkpoint=false", *args.overrides]

    def one(label: str, r: int) -> dict:
        ov = args.configs[label]
        extra = [f"sync.node_size={args.node_size}"] if "sync=hierarchical" in ov else []
        folder = root / label.replace(" ", "_").replace("=", "-")
        return trained([*common, *ov, *extra, f"run.root={folder}"], Path.cwd())

    results = side_by_side(list(args.configs), args.rounds, one, lambda r, label, s:
                           f"round {r}: {label:<28} epoch {s['epoch_time_s_median']:.3f} s")
    rows = {}
    for label, runs in results.items():
        steps = runs[0]["steps_run"]
        cross = runs[0].get("comm_bytes_cross_node")
        rows[label] = {
            "epoch_s": statistics.median(s["epoch_time_s_median"] for s in runs),
            "comm_ms_step": statistics.median(1e3 * s["comm_time_s"] / s["steps_run"] for s in runs),
            "sent_MB_step": runs[0]["comm_bytes_sent"] / steps / 1e6,
            "cross_MB_step": None if cross is None else cross / steps / 1e6,
            "world": runs[0]["world_size"], "nodes": runs[0]["nodes"]}
    first = next(iter(results.values()))[0]
    print(f"\n{first['world_size']} ranks, {first['nodes']} launcher node(s), model {first['model']}, "
          f"{args.steps} steps, {args.rounds} rounds (medians); rank 0's figures; run folders in {root}")
    print(table(["sync", "epoch s", "comm ms/step", "MB sent/step", "MB to other node/step"],
                [(label, f"{row['epoch_s']:.3f}", f"{row['comm_ms_step']:.2f}",
                  f"{row['sent_MB_step']:.3f}", "-" if row["cross_MB_step"] is None
                  else f"{row['cross_MB_step']:.3f}") for label, row in rows.items()]))
    found = {}
    for label in (lb for lb in rows if lb.startswith("hierarchical")):
        for ref in (r for r in ("ring", "ddp") if r in rows):
            a, b = rows[label], rows[ref]
            found[f"{label} / {ref}: epoch"] = a["epoch_s"] / b["epoch_s"]
            found[f"{label} / {ref}: comm per step"] = a["comm_ms_step"] / b["comm_ms_step"]
    return {"root": str(root), "rows": rows, "ratios": found}


BENCHMARKS = {
    "syncs": Benchmark(SYNCS_DOC, SYNCS_SPEC, syncs_add_args, syncs_run),
    "overlap": Benchmark(OVERLAP_DOC, OVERLAP_SPEC, overlap_add_args, overlap_run),
    "compress": Benchmark(COMPRESS_DOC, COMPRESS_SPEC, compress_add_args, compress_run),
    "hierarchical": Benchmark(HIERARCHICAL_DOC, HIERARCHICAL_SPEC, hierarchical_add_args, hierarchical_run),
}
