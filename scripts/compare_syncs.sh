#!/usr/bin/env bash
# Train MNIST with every synchroniser at 2 and 3 ranks and tabulate the results.
#
#   scripts/compare_syncs.sh                       # 5 epochs, worlds 2 and 3, all six syncs
#   EPOCHS=1 WORLDS="2" scripts/compare_syncs.sh   # a quick look
#   scripts/compare_syncs.sh model=cnn             # extra overrides go to every run
#
# Knobs (env): PYTHON (default: the checkout's .venv/bin/python, else python3 from PATH),
# EPOCHS, WORLDS, SYNCS, ROOT. Runs one after another (a Hydra -m sweep per world size): on
# a shared machine, run it when it is quiet. Each run's folder is
# $ROOT/w<world>/<date>_<time>_<sync>_...; the table (scripts/sync_table.py: every sync
# against ddp at each world) is printed and written to $ROOT/table.md.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi
EPOCHS=${EPOCHS:-5}
WORLDS=${WORLDS:-"2 3"}
SYNCS=${SYNCS:-ddp,allreduce,reduce_broadcast,ring,tree,butterfly}
ROOT=${ROOT:-outputs/compare_syncs}

for w in $WORLDS; do
  "$PYTHON" -m ddp_lab -m "sync=$SYNCS" "launcher.nproc_per_node=$w" "train.epochs=$EPOCHS" \
    "run.root=$ROOT/w$w" log.progress=lines "$@"
done
"$PYTHON" "$REPO/scripts/sync_table.py" "$ROOT"/w* | tee "$ROOT/table.md"
