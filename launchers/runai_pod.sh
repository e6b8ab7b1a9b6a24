#!/usr/bin/env bash
# ddp_lab: the entry script of every RunAI pod ({summary}), rendered by `python -m ddp_lab
# launcher=runai`; each pod runs it as `bash RUN_DIR/pod.sh` (runai_submit.sh beside it).
# RunAI (a Kubeflow PyTorchJob) sets in every pod, counting *pods*: WORLD_SIZE = number of
# pods, RANK = this pod's index, MASTER_ADDR:MASTER_PORT = the master pod. torchrun starts
# NPROC_PER_NODE processes and hands *them* WORLD_SIZE/RANK counted in processes.
# Try it without RunAI, two "pods" on this machine:
#   WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 bash pod.sh &
#   WORLD_SIZE=2 RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 bash pod.sh
set -euo pipefail
export DDP_LAB_T0=$(date +%s.%N)  # the pod's own start (a re-created pod's too): start-up counts from here
RUN_DIR={run_dir_q}
NPROC_PER_NODE=${{NPROC_PER_NODE:-{nproc}}}
: "${{WORLD_SIZE:?is not set: RunAI sets it to the number of pods}}"
: "${{RANK:?is not set: RunAI sets it to the index of this pod}}"
: "${{MASTER_ADDR:?is not set: RunAI sets it to the master pod}}"
: "${{MASTER_PORT:?is not set: RunAI sets it}}"
PODS=$WORLD_SIZE
POD_RANK=$RANK
source "$RUN_DIR/pod_stop.sh"  # the pod's log, the graceful stop on SIGTERM (traps first), exit status

{setup}
check_python  # pod_stop.sh: else one line naming what the ranks' python cannot import
export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-1}}
{store_line}
{rdma}

exit_if_stopped  # pod_stop.sh: a SIGTERM during the setup ends the pod before training starts
{python} -m torch.distributed.run \
  --nnodes="$PODS" --node_rank="$POD_RANK" --nproc_per_node="$NPROC_PER_NODE" \
  {rdzv} \
  --max_restarts={max_restarts} \
  -m {entry} "$RUN_DIR" &
wait_for_torchrun $!  # pod_stop.sh: torchrun runs in the background so that the trap runs at once
end_pod  # pod_stop.sh: exit 0 (completed, stopped), {preempted_exit} (preempted: the pod comes back) or torchrun's
