#!/usr/bin/env bash
# Train MNIST with every synchroniser at 2 and 3 ranks and tabulate the results.
#
#   scripts/compare_syncs.sh                       # 5 epochs, worlds 2 and 3, all six syncs
#   EPOCHS=1 WORLDS="2" scripts/compare_syncs.sh   # a quick look
#   scripts/compare_syncs.sh model=cnn             # extra overrides go to every run
#   MODEL=mlp_wide OVERLAP=false,true WORLDS="2 4" EPOCHS=1 BUCKET_MB=4 \
#     scripts/compare_syncs.sh train.max_steps_per_epoch=20   # docs/sync.md's overlap table
#
# Knobs (env): PYTHON (default: the checkout's .venv/bin/python, else python3 from PATH),
# EPOCHS, WORLDS, SYNCS, ROOT, MODEL (default mlp), OVERLAP (sync.overlap of every sync
# but ddp, which always overlaps: false, true or false,true for both; default false),
# BUCKET_MB (bucket size for all: ddp's sync.bucket_cap_mb, the others' sync.bucket_mb;
# default: each config's own, 25).
# Runs one after another (ddp, then a Hydra -m sweep of sync.overlap per other sync, per world size): on
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
MODEL=${MODEL:-mlp}
OVERLAP=${OVERLAP:-false}

# ddp refuses sync.overlap=false (it always overlaps): it runs on its own
OTHERS=$(echo ",$SYNCS," | sed 's/,ddp,/,/g; s/^,//; s/,$//')
for w in $WORLDS; do
  common=("launcher.nproc_per_node=$w" "train.epochs=$EPOCHS" "model=$MODEL"
          "run.root=$ROOT/w$w" log.progress=lines)
  ddp_bucket=() bucket=()
  if [ -n "${BUCKET_MB:-}" ]; then ddp_bucket=("sync.bucket_cap_mb=$BUCKET_MB"); bucket=("sync.bucket_mb=$BUCKET_MB"); fi
  if [ "$OTHERS" != "$SYNCS" ]; then
    "$PYTHON" -m ddp_lab sync=ddp "${ddp_bucket[@]}" "${common[@]}" "$@"
  fi
  # one sweep per sync: a multirun composes its base config without the swept keys, and
  # sync.bucket_mb does not exist in the default sync (ddp)
  for s in ${OTHERS//,/ }; do
    "$PYTHON" -m ddp_lab -m "sync=$s" "sync.overlap=$OVERLAP" "${bucket[@]}" "${common[@]}" "$@"
  done
done
"$PYTHON" "$REPO/scripts/sync_table.py" "$ROOT"/w* | tee "$ROOT/table.md"
