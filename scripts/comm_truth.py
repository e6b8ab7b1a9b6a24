#!/usr/bin/env python
"""Are the numbers true? Training comm per step against the bench and the alpha-beta model.

    .venv/bin/python scripts/comm_truth.py                       # runs everything (~15 min, 2 cores)
    .venv/bin/python scripts/comm_truth.py --worlds 2 --models mlp_wide --syncs allreduce,ddp
    .venv/bin/python scripts/comm_truth.py --runs OUT/train --bench OUT/bench   # re-read folders

What it runs (unless given folders): one short training run per sync x model x world
(`python -m ddp_lab`, every step traced: `timing.trace_steps` = the steps), then per world
one bench run (`python -m ddp_lab.bench`) of all_reduce / reduce / broadcast with every
implementation the synchronisers use, at log-spaced sizes *and* at every bucket size the
training runs put on the wire (`bench.sizes`), right after the training, so that both see
the same machine load.

What it prints, one row per training run (`ddp_lab.report.truth`):

- measured ms/step: the median over steps of rank 0's communication per step, as the
  synchroniser recorded it (CommRecorder: DDP's hook per bucket, ours per call; the union
  of the step's call intervals);
- bench ms/step: the bench's median time of the same algorithm at each call's size,
  summed over the step's calls -- check (a), target within 20%;
- model ms/step: what `ddp_lab.report.model` predicts from alpha-beta fits of that bench
  run, one fit per collective and implementation the synchroniser calls -- check (b),
  target within 30%;
- the ratios measured / bench and measured / model, and whether each is within its target.

Not a test: the figures depend on the machine and on what else runs on it (say which load
when quoting them; `uptime` is printed). Writes truth.json and truth.md into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
from ddp_lab.report import truth

SYNCS = ("ddp", "allreduce", "reduce_broadcast", "ring", "tree", "butterfly")
#: training steps per model: enough calls for a median, short enough for a 2-core machine
STEPS = {"mlp": 200, "mlp_wide": 30}
#: the bench's implementation of each (collective, algorithm) a synchroniser calls
BENCH_OPS = ["all_reduce", "reduce", "broadcast"]
BENCH_IMPLS = ["torch", "ring", "tree", "butterfly"]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(cmd: list[str], log: Path) -> Path:
    """Run one CLI command; its run folder (the last `run dir: PATH` line)."""
    t0 = time.time()
    p = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n{p.stdout}{p.stderr}\n")
    lines = [x for x in p.stdout.splitlines() if x.startswith("run dir: ")]
    if p.returncode != 0 or not lines:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    print(f"  {time.time() - t0:5.1f} s  {' '.join(cmd[3:])}", flush=True)
    return Path(lines[-1][len("run dir: "):])


def train_runs(args: argparse.Namespace, out: Path, world: int) -> list[Path]:
    dirs = []
    for model in args.models:
        steps = args.steps or STEPS.get(model, 30)
        for sync in args.syncs:
            dirs.append(_run([
                sys.executable, "-m", "ddp_lab", f"sync={sync}", f"model={model}",
                f"launcher.nproc_per_node={world}", "train.epochs=1",
                f"train.max_steps_per_epoch={steps}", f"timing.trace_steps={steps}",
                "train.checkpoint=false", "train.threads=1", "log.progress=lines",
                f"data.root={args.data_root}", f"run.root={out / 'train'}"], out / "commands.log"))
    return dirs


def bench_run(args: argparse.Namespace, out: Path, world: int, sizes: list[int]) -> Path:
    return _run([
        sys.executable, "-m", "ddp_lab.bench", f"launcher.nproc_per_node={world}",
        f"bench.ops=[{','.join(BENCH_OPS)}]", f"bench.impl=[{','.join(BENCH_IMPLS)}]",
        f"bench.min_elements={args.bench_min}", f"bench.max_elements={args.bench_max}",
        f"bench.points={args.bench_points}", f"bench.sizes=[{','.join(map(str, sizes))}]",
        "log.progress=lines", f"run.root={out / 'bench'}"], out / "commands.log")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--models", default="mlp,mlp_wide")
    ap.add_argument("--syncs", default=",".join(SYNCS))
    ap.add_argument("--steps", type=int, default=0, help="steps per run (0: per model, %s)" % STEPS)
    ap.add_argument("--bench-min", type=int, default=1024)
    ap.add_argument("--bench-max", type=int, default=1 << 24)
    ap.add_argument("--bench-points", type=int, default=8)
    ap.add_argument("--data-root", default=str(REPO / "data"))
    ap.add_argument("--out", default="outputs/comm_truth")
    ap.add_argument("--runs", nargs="*", default=None, help="training run folders (or their parents)")
    ap.add_argument("--bench", nargs="*", default=None, help="bench run folders (or their parents)")
    args = ap.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.syncs = [s for s in args.syncs.split(",") if s]
    worlds = [int(w) for w in args.worlds.split(",") if w]
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} "
          f"(1/5/15 min), {os.cpu_count()} cores", flush=True)

    if args.runs is None or args.bench is None:
        runs, benches = [], []
        for world in worlds:
            mine = []
            if args.runs is None:
                print(f"world {world}: training runs", flush=True)
                mine = train_runs(args, out, world)
            runs += mine
            if args.bench is None:
                sizes = truth.wire_sizes(truth.find_train_runs(mine or args.runs)).get(world, [])
                print(f"world {world}: bench (call sizes {sizes} elements)", flush=True)
                benches.append(bench_run(args, out, world, sizes))
        run_paths = runs if args.runs is None else args.runs
        bench_paths = benches if args.bench is None else args.bench
    else:
        run_paths, bench_paths = args.runs, args.bench

    table = truth.truth_table(truth.find_train_runs(run_paths), truth.find_bench_runs(bench_paths))
    md = truth.markdown(table)
    print("\n".join(md))
    from ddp_lab.run.files import atomic_write_text

    atomic_write_text(out / "truth.json", json.dumps(table, indent=1))
    atomic_write_text(out / "truth.md", "\n".join(md) + "\n")
    print(f"load at the end: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f}\nwritten: {out / 'truth.md'}, {out / 'truth.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
