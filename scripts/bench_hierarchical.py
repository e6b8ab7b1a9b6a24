#!/usr/bin/env python
"""Hierarchical all-reduce against the flat ones, side by side, measured in one run.

    # the loopback SLURM cluster, 2 nodes x 2 ranks (scripts/slurm_cluster.sh up first)
    SLURM_CONF=... .venv/bin/python scripts/bench_hierarchical.py --repeats 2 -- \\
        launcher=slurm launcher.nodes=2 launcher.nproc_per_node=2 model=mlp_wide
    # one machine, 4 ranks as 2 pretend nodes (the flat syncs ignore sync.node_size)
    .venv/bin/python scripts/bench_hierarchical.py --node-size 2 -- launcher.nproc_per_node=4

Each configuration is a real `python -m ddp_lab` run (1 epoch of `--steps` steps, the
overrides after `--` added to each), the configurations in a rotating order `--repeats`
times, so slow drift on a shared machine hits each alike. Printed per configuration, from
rank 0's summary.json (rank 0 leads node 0): the median epoch time, comm time per step,
MB sent per step, MB sent to another node per step (`comm_bytes_cross_node`: only
sync=hierarchical knows the nodes; the flat ring's figure is its formula, see
docs/sync.md) and the ratios of each hierarchical variant to ring and to ddp.
Not a test: numbers depend on the machine, and loopback "nodes" share one machine's
memory, so no network is measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

# (label, overrides)
CONFIGS = [
    ("ddp", ["sync=ddp"]),
    ("ring", ["sync=ring"]),
    ("hierarchical inter=ring", ["sync=hierarchical", "sync.inter=ring"]),
    ("hierarchical inter=library", ["sync=hierarchical", "sync.inter=library"]),
]


def run(overrides: list[str], root: Path) -> dict:
    cmd = [sys.executable, "-m", "ddp_lab", *overrides, f"run.root={root}", "log.progress=lines"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    run_dir = Path(p.stdout.rstrip().splitlines()[-1].removeprefix("run dir: "))
    return json.loads((run_dir / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--node-size", type=int, default=0, help="sync.node_size for hierarchical")
    ap.add_argument("--only", default="", help='comma-separated labels, e.g. "ring,hierarchical inter=ring"')
    ap.add_argument("--root", type=Path, default=Path("outputs/bench_hierarchical"),
                    help="run folders under this folder")
    ap.add_argument("overrides", nargs="*", help="ddp_lab overrides for every run (after --)")
    args = ap.parse_args()
    root = args.root.resolve()
    common = ["train.epochs=1", f"train.max_steps_per_epoch={args.steps}",
              "train.checkpoint=false", *args.overrides]
    configs = CONFIGS
    if args.only:
        wanted = [w.strip() for w in args.only.split(",")]
        unknown = sorted(set(wanted) - {label for label, _ in CONFIGS})
        if unknown:
            sys.exit(f"--only: no configuration {unknown}; choose from {[lb for lb, _ in CONFIGS]}")
        configs = [c for c in CONFIGS if c[0] in wanted]
    results: dict[str, list[dict]] = {label: [] for label, _ in configs}
    for r in range(args.repeats):
        for label, ov in configs[r % len(configs):] + configs[:r % len(configs)]:
            extra = [f"sync.node_size={args.node_size}"] if "sync=hierarchical" in ov else []
            s = run([*common, *ov, *extra], root / label.replace(" ", "_").replace("=", "-"))
            results[label].append(s)
            print(f"round {r + 1}: {label:<28} epoch {s['epoch_time_s_median']:.3f} s", flush=True)
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
          f"{args.steps} steps, {args.repeats} repeats (medians); rank 0's figures; run folders in {root}")
    print(f"{'sync':<28} {'epoch s':>8} {'comm ms/step':>13} {'MB sent/step':>13} {'MB to other node/step':>22}")
    for label, row in rows.items():
        cross = "-" if row["cross_MB_step"] is None else f"{row['cross_MB_step']:.3f}"
        print(f"{label:<28} {row['epoch_s']:8.3f} {row['comm_ms_step']:13.2f} "
              f"{row['sent_MB_step']:13.3f} {cross:>22}")
    print()
    for label in (lb for lb in rows if lb.startswith("hierarchical")):
        for ref in (r for r in ("ring", "ddp") if r in rows):
            a, b = rows[label], rows[ref]
            print(f"{label} / {ref}: epoch {a['epoch_s'] / b['epoch_s']:.2f}, "
                  f"comm per step {a['comm_ms_step'] / b['comm_ms_step']:.2f}")


if __name__ == "__main__":
    main()
