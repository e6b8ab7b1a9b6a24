"""Hierarchical all-reduce against the flat ones, side by side, measured
in one run (docs/sync.md, "Hierarchical").

    # one machine, 4 ranks as 2 pretend nodes (the flat syncs ignore sync.node_size)
    python -m ddp_lab.bench.suite hierarchical --node-size 2 -- launcher.nproc_per_node=4

Each configuration is a real `python -m ddp_lab` run (1 epoch of
`--steps` steps, the overrides after `--` added), in rotating order;
printed from rank 0's summary.json: epoch and comm time, MB sent (and to
another node) per step, each variant's ratio to ring and ddp.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from ..suite import Spec, chosen, rounds, trained

# label -> overrides
CONFIGS = {
    "ddp": ["sync=ddp"],
    "ring": ["sync=ring"],
    "hierarchical inter=ring": ["sync=hierarchical", "sync.inter=ring"],
    "hierarchical inter=library": ["sync=hierarchical", "sync.inter=library"],
}
SPEC = Spec(compares="ddp, ring and sync=hierarchical (ring or the library between nodes), "
                     "whole 1-epoch runs", rounds=2, data=False,
            ratios="each hierarchical variant / ring and / ddp: epoch, comm per step")


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--node-size", type=int, default=0, help="sync.node_size for hierarchical")
    ap.add_argument("--only", default="", help='comma-separated labels, e.g. "ring,hierarchical inter=ring"')
    ap.add_argument("--root", type=Path, default=Path("outputs/bench_hierarchical"),
                    help="run folders under this folder")
    ap.add_argument("overrides", nargs="*", help="ddp_lab overrides for every run (after --)")


def run(args: argparse.Namespace) -> dict:
    root = args.root.resolve()
    common = ["train.epochs=1", f"train.max_steps_per_epoch={args.steps}",
              "train.checkpoint=false", *args.overrides]
    configs = chosen(CONFIGS, args.only)
    results: dict[str, list[dict]] = {label: [] for label in configs}
    for r, label in rounds(list(configs), args.rounds):
        ov = configs[label]
        extra = [f"sync.node_size={args.node_size}"] if "sync=hierarchical" in ov else []
        folder = root / label.replace(" ", "_").replace("=", "-")
        s = trained([*common, *ov, *extra, f"run.root={folder}"], Path.cwd())
        results[label].append(s)
        print(f"round {r}: {label:<28} epoch {s['epoch_time_s_median']:.3f} s", flush=True)
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
    print(f"{'sync':<28} {'epoch s':>8} {'comm ms/step':>13} {'MB sent/step':>13} {'MB to other node/step':>22}")
    for label, row in rows.items():
        cross = "-" if row["cross_MB_step"] is None else f"{row['cross_MB_step']:.3f}"
        print(f"{label:<28} {row['epoch_s']:8.3f} {row['comm_ms_step']:13.2f} "
              f"{row['sent_MB_step']:13.3f} {cross:>22}")
    found = {}
    for label in (lb for lb in rows if lb.startswith("hierarchical")):
        for ref in (r for r in ("ring", "ddp") if r in rows):
            a, b = rows[label], rows[ref]
            found[f"{label} / {ref}: epoch"] = a["epoch_s"] / b["epoch_s"]
            found[f"{label} / {ref}: comm per step"] = a["comm_ms_step"] / b["comm_ms_step"]
    return {"root": str(root), "rows": rows, "ratios": found}
