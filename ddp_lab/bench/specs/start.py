"""How soon a command answers: the first console line of a run, and the
report's start.

    python -m ddp_lab.bench.suite start                      # this checkout, 10 rounds
    python -m ddp_lab.bench.suite start --vs ../before       # side by side with another

Each the median (min-max) over rounds: `python -m ddp_lab
train.epochs=1` to its first console line (then SIGTERM), and `python -m
ddp_lab.report --help`; `--vs DIR` runs DIR's ddp_lab with the same
interpreter (docs/performance.md, "Time to the first step").
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..suite import REPO, Spec, UsageError

SPEC = Spec(compares="this checkout and --vs DIR's, each command in every round", rounds=10,
            ratios="after / before: the first console line, the report's start")


def first_line_s(tree: Path, work: Path, data_root: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree))
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "ddp_lab", "train.epochs=1",
                             f"data.root={data_root}", f"run.root={work / 'runs'}"],
                            cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    took = time.perf_counter() - t0
    # the run's own stop: its ranks checkpoint and end
    proc.terminate()
    proc.communicate(timeout=120)
    if not line.startswith("[ddp_lab] starting"):
        sys.exit(f"error: {tree}: the first line was {line.strip()!r}")
    return took


def report_s(tree: Path, work: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ddp_lab.report", "--help"], cwd=work, env=env,
                   stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pause", type=float, default=2.0, help="seconds between runs")
    p.add_argument("--vs", type=Path, help="another checkout, timed in the same rounds")


def check(args: argparse.Namespace) -> None:
    if args.vs and not (args.vs / "ddp_lab" / "__main__.py").is_file():
        raise UsageError(f"--vs {args.vs}: not a ddp_lab checkout")


def run(args: argparse.Namespace) -> dict:
    trees = {"before": args.vs.resolve(), "after": REPO} if args.vs else {"this": REPO}
    got = {name: {"first line": [], "report": []} for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for name, tree in trees.items():
                got[name]["first line"].append(first_line_s(tree, Path(tmp), args.data_root))
                time.sleep(args.pause)
                got[name]["report"].append(report_s(tree, Path(tmp)))
    print(f"\n{args.rounds} round(s), load average {os.getloadavg()[0]:.2f} at the end")
    print("| measure | " + " | ".join(trees) + (" | after / before |" if args.vs else " |"))
    print("| --- |" + " --- |" * (len(trees) + bool(args.vs)))
    found = {}
    for measure in ("first line", "report"):
        cells = [f"{statistics.median(v):.2f} s ({min(v):.2f}-{max(v):.2f})"
                 for v in (got[name][measure] for name in trees)]
        if args.vs:
            ratio = statistics.median(got["after"][measure]) / statistics.median(got["before"][measure])
            cells.append(f"{ratio:.2f}")
            found[f"{measure}: after / before"] = ratio
        print(f"| {measure} | " + " | ".join(cells) + " |")
    return {"seconds": got, "ratios": found}
