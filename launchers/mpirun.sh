#!/usr/bin/env bash
# ddp_lab: Open MPI's mpirun, one rank per slot, rendered by `python -m ddp_lab launcher=mpirun`.
# Every host runs mpi_rank.sh (setup lines, then the worker); gloo/nccl do the communication,
# mpirun only starts the processes. Needs passwordless ssh to every host but this one, and
# this run folder at the same path on every host (a shared home does it).
# Run it again by hand, in the same folder: bash launch.sh. Knobs (env): MASTER_ADDR, MASTER_PORT.
set -euo pipefail

export DDP_LAB_RUN_DIR={run_dir}
# start-up counts from the command that started the job (ddp_lab sets it), else from here
export DDP_LAB_T0=${{DDP_LAB_T0:-$(date +%s.%N)}}
# rank 0 serves the rendezvous here; every host must reach this address
export MASTER_ADDR=${{MASTER_ADDR:-{master_addr}}}
export MASTER_PORT=${{MASTER_PORT:-{master_port}}}
# no hwloc topology shared (no rank uses MPI): its write can kill a daemon (docs/launchers.md)
export OMPI_MCA_rtc_hwloc_vmhole=${{OMPI_MCA_rtc_hwloc_vmhole:-none}}

# $DDP_LAB_RUN_DIR/hostfile: {hosts_summary}; --map-by slot fills each host's slots before
# the next (mpi_rank.sh relies on it); --bind-to none leaves the cores to torch's own threads.
exec {mpirun} {flags}\
  --hostfile "$DDP_LAB_RUN_DIR/hostfile" -np {np} --map-by slot --bind-to none \
  -x MASTER_ADDR -x MASTER_PORT -x DDP_LAB_RUN_DIR -x DDP_LAB_T0{extra} \
  bash "$DDP_LAB_RUN_DIR/mpi_rank.sh"
