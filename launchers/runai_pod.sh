#!/usr/bin/env bash
# ddp_lab: the entry script of every RunAI pod ({summary}),
# rendered by `python -m ddp_lab launcher=runai`; `runai submit-dist pytorch` runs
# `bash {run_dir_q}/pod.sh` in each pod (see runai_submit.sh beside it).
#
# RunAI (a Kubeflow PyTorchJob) sets in every pod, counting *pods*:
#   WORLD_SIZE = number of pods, RANK = this pod's index, MASTER_ADDR:MASTER_PORT = the master pod.
# torchrun then starts NPROC_PER_NODE processes and hands *them* WORLD_SIZE/RANK counted
# in processes (pods x NPROC_PER_NODE): the two meanings never meet in one process.
#
# Try it without RunAI, two "pods" on this machine:
#   WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 bash pod.sh &
#   WORLD_SIZE=2 RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 bash pod.sh
set -euo pipefail

RUN_DIR={run_dir_q}
NPROC_PER_NODE=${{NPROC_PER_NODE:-{nproc}}}
: "${{WORLD_SIZE:?is not set: RunAI sets it to the number of pods}}"
: "${{RANK:?is not set: RunAI sets it to the index of this pod}}"
: "${{MASTER_ADDR:?is not set: RunAI sets it to the master pod}}"
: "${{MASTER_PORT:?is not set: RunAI sets it}}"
PODS=$WORLD_SIZE
POD_RANK=$RANK

# the pod's output also goes to the run folder: `runai logs` loses it after a while
mkdir -p "$RUN_DIR/logs"
exec > >(tee -a "$RUN_DIR/logs/pod$POD_RANK.log") 2>&1
echo "[pod $POD_RANK/$PODS] $(hostname): master $MASTER_ADDR:$MASTER_PORT, $NPROC_PER_NODE process(es)"

{setup}
export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-1}}
# a fresh store per restart attempt (pytorch/pytorch#135712)
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
{rdma}

rc=0
{python} -m torch.distributed.run \
  --nnodes="$PODS" --node_rank="$POD_RANK" --nproc_per_node="$NPROC_PER_NODE" \
  {rdzv} \
  --max_restarts={max_restarts} \
  -m {entry} "$RUN_DIR" || rc=$?

# launcher.wait follows these files from the submitting machine (the run folder is shared)
echo "$rc" > "$RUN_DIR/logs/.pod$POD_RANK.exit.tmp"
mv -f "$RUN_DIR/logs/.pod$POD_RANK.exit.tmp" "$RUN_DIR/logs/pod$POD_RANK.exit"
echo "[pod $POD_RANK/$PODS] exit status $rc"
exit "$rc"
