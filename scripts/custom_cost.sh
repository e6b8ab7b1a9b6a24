#!/usr/bin/env bash
# What the watched send/recv of sync=custom cost in a training step: the same textbook ring
# (ddp_lab/collectives/ring.py) run as sync=ring and as sync=custom (its default function),
# interleaved ROUNDS times on 2 ranks; prints each run's median epoch time and the ratio of
# the medians (docs/exercises.md quotes it).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
OUT=$(mktemp -d)
PY=${PY:-.venv/bin/python}
for r in $(seq "$ROUNDS"); do
  for s in ring custom; do
    $PY -m ddp_lab sync=$s launcher.nproc_per_node=2 train.epochs=3 train.max_steps_per_epoch=150 \
      log.progress=lines run.root="$OUT" run.name="${s}_r$r" > /dev/null
  done
done
$PY - "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path
runs = {}
for p in Path(sys.argv[1]).glob("*/summary.json"):
    s = json.loads(p.read_text())
    runs.setdefault(s["sync"], []).append(s["epoch_time_s_median"])
for k, v in sorted(runs.items()):
    print(f"{k:7s} median epoch {statistics.median(v):.3f} s  runs {sorted(round(x, 3) for x in v)}")
print(f"custom / ring: {statistics.median(runs['custom']) / statistics.median(runs['ring']):.3f}")
PY
rm -rf "$OUT"
