#!/usr/bin/env bash
# ddp_lab: what mpirun starts for every rank, on its host (rendered by launcher=mpirun).
set -euo pipefail

{setup}
{pythonpath}
{container}{python_check}

# Open MPI gives rank and local rank but no node index: count it from the slots, which
# mpirun --map-by slot fills host by host in hostfile order.
SLOTS=({slots})
r=$OMPI_COMM_WORLD_RANK
node=0
for s in "${{SLOTS[@]}}"; do
  if (( r < s )); then break; fi
  r=$(( r - s ))
  node=$(( node + 1 ))
done
export DDP_LAB_NODE_RANK=$node DDP_LAB_NUM_NODES=${{#SLOTS[@]}}

exec {python} -m {entry} "${{DDP_LAB_RUN_DIR:-{run_dir}}}"
