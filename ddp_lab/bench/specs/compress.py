"""Gradient compression (sync.compress): bytes, time per epoch and
accuracy, side by side (docs/compression_overlap.md, "What it buys").

    python -m ddp_lab.bench.suite compress                              # mlp, 5 epochs
    python -m ddp_lab.bench.suite compress --only "ddp none,ddp fp16" --rounds 3

Each configuration is one real training run, rounds in rotating order;
each figure with its ratio to the uncompressed run of the same
synchroniser.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from ..suite import Spec, chosen, rounds, trained

#: "synchroniser sync.compress": ddp through torch's hooks, ring (ours)
#: through _reduce
CONFIGS = {f"{s} {c}": (s, c) for s, c in [
    ("ddp", "none"), ("ddp", "fp16"), ("ddp", "bf16"), ("ddp", "powersgd"),
    ("ring", "none"), ("ring", "fp16"), ("ring", "bf16")]}
SPEC = Spec(compares="ddp and ring, each uncompressed, fp16, bf16 (and ddp powersgd): "
                     "whole training runs", rounds=1,
            ratios="bytes sent / step and epoch time, each / the same sync uncompressed")


def run_one(sync: str, compress: str, args: argparse.Namespace, root: Path) -> dict:
    """One training run; its summary.json."""
    return trained([f"sync={sync}", f"sync.compress={compress}", f"model={args.model}",
                    f"launcher.nproc_per_node={args.world}", f"train.epochs={args.epochs}",
                    f"train.max_steps_per_epoch={args.max_steps}", f"data.root={args.data_root}",
                    f"run.root={root}", *args.override], root)


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--max-steps", type=int, default=0, help="train.max_steps_per_epoch (0 = all)")
    ap.add_argument("--only", default="", help='comma-separated, e.g. "ddp none,ddp fp16"')
    ap.add_argument("override", nargs="*", help="more overrides for every run")


def run(args: argparse.Namespace) -> dict:
    configs = chosen(CONFIGS, args.only)
    rows: dict[tuple, list[dict]] = {c: [] for c in configs.values()}
    with tempfile.TemporaryDirectory(prefix="bench_compress_") as tmp:
        for _, (sync, compress) in rounds(list(configs.values()), args.rounds):
            s = run_one(sync, compress, args, Path(tmp))
            rows[(sync, compress)].append({
                "sent_per_step": s["comm_bytes_sent"] / s["steps_run"],
                "epoch_s": s["epoch_time_s_median"], "accuracy": s["test_accuracy"],
                "comm_ms_per_step": 1e3 * (s["comm_time_s"] or 0) / s["steps_run"]})
            print(f"  {sync} {compress}: {rows[(sync, compress)][-1]}", file=sys.stderr,
                  flush=True)
    med = {c: {k: statistics.median(x[k] for x in v) for k in v[0]} for c, v in rows.items()}
    print(f"{args.model}, {args.world} ranks (gloo), {args.epochs} epochs"
          f"{f' of {args.max_steps} steps' if args.max_steps else ''}, "
          f"median of {args.rounds} run(s) each; ratio = / the same sync uncompressed\n")
    print("| sync | compress | bytes sent / step | ratio | comm ms / step | epoch s | ratio "
          "| test accuracy | difference |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    found = {}
    for (sync, compress), m in med.items():
        base = med.get((sync, "none"))
        ratio = (lambda k: f"{m[k] / base[k]:.3f}" if base and base[k] else "-")
        diff = f"{m['accuracy'] - base['accuracy']:+.4f}" if base else "-"
        print(f"| {sync} | {compress} | {m['sent_per_step']:,.0f} | {ratio('sent_per_step')} "
              f"| {m['comm_ms_per_step']:.2f} | {m['epoch_s']:.3f} | {ratio('epoch_s')} "
              f"| {m['accuracy']:.4f} | {diff} |")
        if base and compress != "none":
            found[f"{sync} {compress} / none: bytes"] = m["sent_per_step"] / base["sent_per_step"]
            found[f"{sync} {compress} / none: epoch"] = m["epoch_s"] / base["epoch_s"]
    return {"runs": {f"{s} {c}": v for (s, c), v in rows.items()}, "ratios": found}
