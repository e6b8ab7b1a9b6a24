"""Are the numbers true? Training comm per step against the bench and
the alpha-beta model.

    python -m ddp_lab.bench.suite truth                       # runs everything
    python -m ddp_lab.bench.suite truth --runs DIR/train --bench DIR/bench   # re-read folders

Unless given folders: one short traced training run per sync x model x world, then per world one
bench run of the synchronisers' collectives at the sizes the runs put on the wire; one row per run
(`ddp_lab.report.truth_table`). Writes truth.json and truth.md into --dir (docs/benchmarks.md, "Are
the numbers true?").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

from ...report import truth_table as truth
from .. import suite
from ..suite import Benchmark, REPO, Spec, UsageError

SPEC = Spec(compares="each training run's comm per step, the bench at the same call sizes "
                     "and the alpha-beta model of that bench", rounds=None,
            ratios="measured / bench (target within 20%) and measured / model (30%), per run")

LAUNCHERS = ("local", "slurm")
SYNCS = ("ddp", "allreduce", "reduce_broadcast", "ring", "tree", "butterfly")
#: training steps per model: enough calls for a median, short enough for a 2-core machine
STEPS = {"mlp": 200, "mlp_wide": 30}
#: the bench's implementation of each (collective, algorithm) a synchroniser calls
BENCH_OPS = ["all_reduce", "reduce", "broadcast"]
BENCH_IMPLS = ["torch", "ring", "tree", "butterfly"]


def _run(entry: str, overrides: list[str]) -> Path:
    """One run of `python -m entry`; its run folder."""
    t0 = time.time()
    run_dir = suite.trained(overrides, REPO, entry=entry)["run_dir"]
    print(f"  {time.time() - t0:5.1f} s  {' '.join(overrides)}", flush=True)
    return Path(run_dir)


def launch(args: argparse.Namespace, world: int) -> list[str]:
    """The launcher overrides of one run of `world` ranks."""
    if args.launcher == "local":
        return [f"launcher.nproc_per_node={world}"]
    return ["launcher=slurm", f"launcher.nodes={args.nodes}",
            f"launcher.nproc_per_node={world // args.nodes}", "launcher.wait=true"]


def train_runs(args: argparse.Namespace, out: Path, world: int) -> list[Path]:
    dirs = []
    for model in args.models:
        steps = args.steps or STEPS.get(model, 30)
        for sync in args.syncs:
            dirs.append(_run("ddp_lab", [
                f"sync={sync}", f"model={model}",
                *launch(args, world), *args.set, "train.epochs=1",
                f"train.max_steps_per_epoch={steps}", f"timing.trace_steps={steps}",
                "train.checkpoint=false", "train.threads=1",
                f"data.root={args.data_root}", f"run.root={out / 'train'}"]))
    return dirs


def bench_run(args: argparse.Namespace, out: Path, world: int, sizes: list[int]) -> Path:
    return _run("ddp_lab.bench", [
        *launch(args, world),
        f"bench.ops=[{','.join(BENCH_OPS)}]", f"bench.impl=[{','.join(BENCH_IMPLS)}]",
        f"bench.min_elements={args.bench_min}", f"bench.max_elements={args.bench_max}",
        f"bench.points={args.bench_points}", f"bench.sizes=[{','.join(map(str, sizes))}]",
        f"run.root={out / 'bench'}"])


def _list(option: str, text: str, allowed=None, least: int = 1) -> list:
    """A comma list of --option: ints of `least` or more, or names of `allowed`."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise UsageError(f"{option} {text!r}: give a comma-separated list")
    for x in items:
        if allowed is None and not (x.isdigit() and int(x) >= least):
            raise UsageError(f"{option} {text}: {x!r} is not an integer of {least} or more")
        if allowed is not None and x not in allowed:
            raise UsageError(f"{option} {text}: {x!r} is not one of {', '.join(allowed)}")
    return items if allowed is not None else [int(x) for x in items]


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--models", default="mlp,mlp_wide")
    ap.add_argument("--syncs", default=",".join(SYNCS))
    ap.add_argument("--launcher", default="local", help=f"{' | '.join(LAUNCHERS)} (default local)")
    ap.add_argument("--nodes", default="1",
                    help="nodes of every run (--launcher slurm); a world is nodes x world/nodes ranks")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override for every training run, e.g. --set 'model.hidden=[1024]'")
    ap.add_argument("--steps", type=int, default=0, help="steps per run (0: per model, %s)" % STEPS)
    ap.add_argument("--bench-min", type=int, default=1024)
    ap.add_argument("--bench-max", type=int, default=1 << 24)
    ap.add_argument("--bench-points", type=int, default=8)
    ap.add_argument("--dir", default="outputs/comm_truth",
                    help="the runs, truth.json and truth.md go here")
    ap.add_argument("--runs", nargs="*", default=None, help="training run folders (or their parents)")
    ap.add_argument("--bench", nargs="*", default=None, help="bench run folders (or their parents)")


def check(args: argparse.Namespace) -> None:
    args.models = [m for m in args.models.split(",") if m]
    args.syncs = _list("--syncs", args.syncs, SYNCS)
    args.worlds = _list("--worlds", args.worlds, least=2)
    if args.launcher not in LAUNCHERS:
        raise UsageError(f"--launcher {args.launcher}: give one of {', '.join(LAUNCHERS)}")
    (args.nodes,) = _list("--nodes", args.nodes)
    if args.launcher == "local" and args.nodes != 1:
        raise UsageError(f"--nodes {args.nodes}: local runs are one node; add --launcher slurm")
    for w in args.worlds:
        if w % args.nodes:
            raise UsageError(f"--worlds {','.join(map(str, args.worlds))}: {w} ranks do not split "
                             f"over --nodes {args.nodes}; give multiples of {args.nodes}")
    for kv in args.set:
        if "=" not in kv or kv.startswith("="):
            raise UsageError(f"--set {kv}: give KEY=VALUE, e.g. --set 'model.hidden=[1024]'")
    if args.launcher == "slurm" and args.runs is None and not shutil.which("sbatch"):
        raise UsageError("--launcher slurm: no sbatch on PATH; bring a cluster up and use its "
                         "environment (docs/network.md)")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run(args: argparse.Namespace) -> dict:
    out = Path(args.dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print(f"load: {_load()} (1/5/15 min), {os.cpu_count()} cores", flush=True)

    run_paths = [] if args.runs is None else args.runs
    bench_paths = [] if args.bench is None else args.bench
    for world in args.worlds:  # nothing to run where both folders are given
        mine = []
        if args.runs is None:
            print(f"world {world}: training runs", flush=True)
            mine = train_runs(args, out, world)
            run_paths += mine
        if args.bench is None:
            sizes = truth.wire_sizes(mine or args.runs).get(world, [])
            print(f"world {world}: bench (call sizes {sizes} elements)", flush=True)
            bench_paths.append(bench_run(args, out, world, sizes))

    table = truth.truth_table(run_paths, bench_paths)
    md = truth.markdown(table)
    print("\n".join(md))
    from ddp_lab.folder.files import atomic_write_text

    atomic_write_text(out / "truth.json", json.dumps(table, indent=1))
    atomic_write_text(out / "truth.md", "\n".join(md) + "\n")
    print(f"load at the end: {_load()}\nwritten: {out / 'truth.md'}, {out / 'truth.json'}")
    return {"rows": table}


BENCHMARKS = {"truth": Benchmark(__doc__, SPEC, add_args, run, check)}
