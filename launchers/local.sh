#!/usr/bin/env bash
# ddp_lab: torchrun on this machine, rendered by `python -m ddp_lab launcher=local`.
# Run it again by hand to repeat the run in the same folder:  bash launch.sh
# Knobs (env): NPROC_PER_NODE, MASTER_PORT, MAX_RESTARTS, OMP_NUM_THREADS.
set -euo pipefail

NPROC_PER_NODE=${{NPROC_PER_NODE:-{nproc}}}
MASTER_PORT=${{MASTER_PORT:-{port}}}
MAX_RESTARTS=${{MAX_RESTARTS:-{max_restarts}}}
# the worker sets torch's thread count itself; this silences torchrun's OMP notice
export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-1}}

exec {python} -m torch.distributed.run \
  --nnodes=1 --nproc_per_node="$NPROC_PER_NODE" \
  --master_addr=127.0.0.1 --master_port="$MASTER_PORT" \
  --max_restarts="$MAX_RESTARTS" \
  -m {entry} {run_dir}
