#!/usr/bin/env python
"""Gradient compression (sync.compress): bytes, time per epoch and accuracy, side by side.

    .venv/bin/python scripts/bench_compress.py                              # mlp, 5 epochs
    .venv/bin/python scripts/bench_compress.py --model mlp_wide --max-steps 40 --epochs 2
    .venv/bin/python scripts/bench_compress.py --only "ddp none,ddp fp16" --repeats 3

Each configuration is one real training run (`python -m ddp_lab`, 2 ranks on gloo by
default, the config defaults otherwise: batch 64 per rank, Adam lr 1e-3, MNIST), run one
after another in one invocation; with `--repeats` the rounds go in a rotating order so
drift on a shared machine hits every configuration alike. From each run's summary.json:
bytes one rank sent per step (the wire's: 16-bit for fp16/bf16, PowerSGD's P and Q plus
what it all-reduces uncompressed), the median epoch time (barrier to barrier, training
only) and the test accuracy after the last epoch. Each is printed with its ratio to the
uncompressed run of the same synchroniser (`<sync> none`), as a Markdown table.
Not a test: times depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: (synchroniser, sync.compress): ddp through torch's hooks, ring (ours) through _reduce
CONFIGS = [("ddp", "none"), ("ddp", "fp16"), ("ddp", "bf16"), ("ddp", "powersgd"),
           ("ring", "none"), ("ring", "fp16"), ("ring", "bf16")]


def run(sync: str, compress: str, args: argparse.Namespace, root: Path) -> dict:
    """One training run; its summary.json."""
    cmd = [sys.executable, "-m", "ddp_lab", f"sync={sync}", f"sync.compress={compress}",
           f"model={args.model}", f"launcher.nproc_per_node={args.world}",
           f"train.epochs={args.epochs}", f"train.max_steps_per_epoch={args.max_steps}",
           f"data.root={args.data_root}", f"run.root={root}", "log.progress=lines",
           *args.override]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{sync} {compress} failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    run_dir = next(line.split("run dir: ", 1)[1].strip() for line in p.stdout.splitlines()
                   if line.startswith("run dir: "))
    return json.loads((Path(run_dir) / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--max-steps", type=int, default=0, help="train.max_steps_per_epoch (0 = all)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--only", default="", help='comma-separated, e.g. "ddp none,ddp fp16"')
    ap.add_argument("--data-root", default=str(REPO / "data"))
    ap.add_argument("--out", help="write every run's figures here (JSON)")
    ap.add_argument("override", nargs="*", help="more overrides for every run")
    args = ap.parse_args()
    configs = CONFIGS if not args.only else [tuple(c.split()) for c in args.only.split(",")]
    rows: dict[tuple, list[dict]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="bench_compress_") as tmp:
        for r in range(args.repeats):
            for sync, compress in configs[r % len(configs):] + configs[:r % len(configs)]:
                s = run(sync, compress, args, Path(tmp))
                rows[(sync, compress)].append({
                    "sent_per_step": s["comm_bytes_sent"] / s["steps_run"],
                    "epoch_s": s["epoch_time_s_median"], "accuracy": s["test_accuracy"],
                    "comm_ms_per_step": 1e3 * (s["comm_time_s"] or 0) / s["steps_run"]})
                print(f"  {sync} {compress}: {rows[(sync, compress)][-1]}", file=sys.stderr,
                      flush=True)
    med = {c: {k: statistics.median(x[k] for x in v) for k in v[0]} for c, v in rows.items()}
    print(f"{args.model}, {args.world} ranks (gloo), {args.epochs} epochs"
          f"{f' of {args.max_steps} steps' if args.max_steps else ''}, "
          f"median of {args.repeats} run(s) each; ratio = / the same sync uncompressed\n")
    print("| sync | compress | bytes sent / step | ratio | comm ms / step | epoch s | ratio "
          "| test accuracy | difference |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (sync, compress), m in med.items():
        base = med.get((sync, "none"))
        ratio = (lambda k: f"{m[k] / base[k]:.3f}" if base and base[k] else "-")
        diff = f"{m['accuracy'] - base['accuracy']:+.4f}" if base else "-"
        print(f"| {sync} | {compress} | {m['sent_per_step']:,.0f} | {ratio('sent_per_step')} "
              f"| {m['comm_ms_per_step']:.2f} | {m['epoch_s']:.3f} | {ratio('epoch_s')} "
              f"| {m['accuracy']:.4f} | {diff} |")
    if args.out:
        Path(args.out).write_text(json.dumps(
            {f"{s} {c}": v for (s, c), v in rows.items()}, indent=1))


if __name__ == "__main__":
    main()
