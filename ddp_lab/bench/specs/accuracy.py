"""Every synchroniser trained at 2 and 3 ranks: accuracy against ddp's, side by side.

    python -m ddp_lab.bench.suite accuracy                    # 5 epochs, worlds 2 and 3, all six syncs
    python -m ddp_lab.bench.suite accuracy --epochs 1 --worlds 2   # a quick look
    python -m ddp_lab.bench.suite accuracy --from outputs/compare_syncs/w2   # the table again

Runs one after another (ddp, then a Hydra -m sweep per other sync) into ROOT/w<world>/...,
read by the report's reader; the table goes to ROOT/table.md. Accuracy is compared with the
ddp run of the same world size, in points (docs/sync.md, "Accuracy after 5 epochs").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from ...report.runs import ReportError, find_runs
from ..suite import Spec, UsageError

SPEC = Spec(compares="every synchroniser at each world size, whole training runs",
            data=False, ratios="none: test accuracy against ddp's, in points (bar: 0.5)")
ORDER = ["ddp", "naive", "allreduce", "reduce_broadcast", "ring", "tree", "butterfly"]


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--worlds", default="2,3", help="world sizes, comma-separated")
    ap.add_argument("--syncs", default="ddp,allreduce,reduce_broadcast,ring,tree,butterfly")
    ap.add_argument("--root", default="outputs/compare_syncs", help="run folders go here")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--overlap", default="false", help="false, true or false,true")
    ap.add_argument("--bucket-mb", default="", help="bucket size for every sync, MB")
    ap.add_argument("--from", dest="from_dirs", nargs="+", default=None,
                    help="no training: the table of these run folders (or their parents)")
    ap.add_argument("override", nargs="*", help="more overrides for every run")


def sweep(args: argparse.Namespace) -> list[str]:
    """Train every sync at every world (ddp alone: it refuses sync.overlap=false, always
    overlapping); the folders of each world."""
    syncs = [s for s in args.syncs.split(",") if s]
    folders = []
    for w in args.worlds.split(","):
        common = [f"launcher.nproc_per_node={w}", f"train.epochs={args.epochs}",
                  f"model={args.model}", f"run.root={args.root}/w{w}", "log.progress=lines"]
        bucket = [f"sync.bucket_mb={args.bucket_mb}"] if args.bucket_mb else []
        ddp_bucket = [f"sync.bucket_cap_mb={args.bucket_mb}"] if args.bucket_mb else []
        runs = [["sync=ddp", *ddp_bucket]] if "ddp" in syncs else []
        # one sweep per sync: a multirun composes its base config without the swept keys,
        # and sync.bucket_mb does not exist in the default sync (ddp)
        runs += [["-m", f"sync={s}", f"sync.overlap={args.overlap}", *bucket]
                 for s in syncs if s != "ddp"]
        for ov in runs:
            subprocess.run([sys.executable, "-m", "ddp_lab", *ov, *common, *args.override],
                           check=True)
        folders.append(f"{args.root}/w{w}")
    return folders


def run(args: argparse.Namespace) -> dict | None:
    folders = args.from_dirs or sweep(args)
    try:
        # the report's own reader: the same run folders, statuses and skips as `ddp_lab.report`
        runs = [r.summary for r in find_runs(folders) if r.kind == "train" and r.ok
                and r.summary.get("status") == "completed"]
    except ReportError as e:
        raise UsageError(str(e)) from None
    if not runs:
        print("no completed runs found", file=sys.stderr)
        return None
    lines = table(runs)
    print("\n".join(lines))
    if not args.from_dirs:
        Path(args.root, "table.md").write_text("\n".join(lines) + "\n")
    return {"runs": runs, "ratios": {}}


def table(runs: list[dict]) -> list[str]:
    """The Markdown table: one row per run, by world, overlap and ORDER."""
    runs.sort(key=lambda r: (r["world_size"], bool(r.get("overlap")) and r["sync"] != "ddp",
                             ORDER.index(r["sync"]) if r["sync"] in ORDER else 99))
    ddp = {r["world_size"]: r["test_accuracy"] for r in runs if r["sync"] == "ddp"}
    out = ["| world | sync | overlap | epochs | test acc (%) | vs ddp (points) | median epoch (s) "
           "| in-flight share | in-flight (ms/step) | exposed share | exposed (ms/step) "
           "| sent (MB/step) | busbw (GB/s) |",
           "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in runs:
        w = r["world_size"]
        delta = 100 * (r["test_accuracy"] - ddp[w]) if w in ddp else None
        n = r.get("steps_run") or None
        comm_ms = 1e3 * r["comm_time_s"] / n if n and r.get("comm_time_s") is not None else None
        exposed_ms = (1e3 * r["comm_exposed_s"] / n if n and r.get("comm_exposed_s") is not None
                      else None)
        sent = r["comm_bytes_sent"] / 1e6 / n if n else None
        overlap = "-" if r.get("overlap") is None else ("yes" if r["overlap"] else "no")
        out.append(f"| {w} | {r['sync']} | {overlap} | {r['epochs_run']} "
                   f"| {100 * r['test_accuracy']:.2f} "
                   f"| {fmt(delta, '+.2f')} | {fmt(r['epoch_time_s_median'], '.2f')} "
                   f"| {fmt(r.get('comm_fraction'), '.0%')} | {fmt(comm_ms, '.2f')} "
                   f"| {fmt(r.get('comm_exposed_fraction'), '.0%')} | {fmt(exposed_ms, '.2f')} "
                   f"| {fmt(sent, '.3f')} | {fmt(r.get('comm_busbw_GBps'), '.3f')} |")
    return out
