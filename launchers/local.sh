#!/usr/bin/env bash
# ddp_lab: torchrun on this machine, rendered by `python -m ddp_lab launcher=local`.
# Run it again by hand to repeat the run in the same folder:  bash launch.sh
# Knobs (env): NPROC_PER_NODE, MASTER_PORT (0: any free port, taken as the store binds it),
# MAX_RESTARTS, OMP_NUM_THREADS.
set -euo pipefail

NPROC_PER_NODE=${{NPROC_PER_NODE:-{nproc}}}
MASTER_PORT=${{MASTER_PORT:-{port}}}
MAX_RESTARTS=${{MAX_RESTARTS:-{max_restarts}}}
# start-up counts from the command that started the job (ddp_lab sets it), else from here
export DDP_LAB_T0=${{DDP_LAB_T0:-$(date +%s.%N)}}
# the worker sets torch's thread count itself; this silences torchrun's OMP notice
export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-1}}
# run the ddp_lab that rendered this script
export PYTHONPATH={code_dir}${{PYTHONPATH:+:$PYTHONPATH}}
{setup}
# Restarts (launcher.max_restarts) need a fresh store per attempt, or the new workers read
# the dead ones' addresses from it and gloo's connect times out: hence c10d rendezvous, not
# static (--master_addr/--master_port), and no sharing of the agent's store with the workers
# (pytorch/pytorch#135712). Only then: an unshared store sits on a port the agent picked and
# released, which another program can take before rank 0 binds it (EADDRINUSE).
if [ "$MAX_RESTARTS" -gt 0 ]; then export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1; fi
# is_host: this torchrun serves the store, so a port taken since ddp_lab checked it fails
# at once; torchrun's guess (127.0.0.1 is us) would instead fall back to dialling the port
# as a client: two connect attempts of read_timeout (60 s) each, then a traceback.
# torchrun's own error (not a rank's) goes to the file below: ddp_lab names it in one line.
export TORCHELASTIC_ERROR_FILE={error_file}
rm -f "$TORCHELASTIC_ERROR_FILE"  # an earlier attempt's, in a folder run again
# torchrun itself, through ddp_lab.launch.torchrun: when a rank fails, its ChildFailedError
# traceback goes to logs/torchrun.log (the console has named the rank already); on CPU the
# ranks start as forks of it, torch already imported (its fork_ranks)
exec {python} -m ddp_lab.launch.torchrun --log={run_dir}/logs/torchrun.log \
  --nnodes=1 --nproc_per_node="$NPROC_PER_NODE" \
  --rdzv_backend=c10d --rdzv_endpoint="127.0.0.1:$MASTER_PORT" \
  --rdzv_conf=join_timeout={join_timeout},is_host=true \
  --max_restarts="$MAX_RESTARTS" \
  -m {entry} {run_dir}
