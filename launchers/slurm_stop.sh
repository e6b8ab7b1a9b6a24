#!/usr/bin/env bash
# ddp_lab: what job.sbatch (or a study's study.sbatch) beside this file does besides starting
# the ranks: it sources this file first, so that the traps catch a stop at any time. Not run
# by itself. It reads RUN_DIR (the running training's folder; a study sets it per point) and
# AGAIN_SCRIPT (the script to submit again; default $RUN_DIR/job.sbatch).
#   check_python     the ranks' python imports what they run, else the job ends here (exit 3)
#   wait_for_srun    wait for srun, which runs in the background so that the traps run at once
#   requeue_or_exit  after a time-limit stop, requeue this job; else exit with srun's status
# (A dry run prints these `#   name` lines in place of this file: launch/base.py sourced_note.)
RESTART=${{SLURM_RESTART_COUNT:-0}}  # how often SLURM requeued this job (0: first start)
MAX_REQUEUES={max_requeues}  # launcher.max_requeues (self-requeues after the time-limit stop)
SELF_REQUEUE={self_requeue}  # launcher.requeue
echo "[sbatch] job $SLURM_JOB_ID (restart $RESTART) on $(hostname) at $(date '+%F %T'): $SLURM_JOB_NUM_NODES node(s) $SLURM_JOB_NODELIST"

# ---- Stop requests
# SLURM sends USR2 to this shell only (--signal=B:USR2@N, launcher.signal_s) ahead of the
# time limit, and SIGTERM to this shell and every process of the job when it ends the
# allocation (scancel, scontrol requeue, preemption, the limit itself; SIGKILL follows
# KillWait seconds later). The trap writes the stop file: rank 0 reads it at its next check,
# all ranks agree, save a mid-epoch checkpoint and exit 0. The file is the path that reaches
# every rank: USR2 itself would kill torchrun (its default action).
GOT_USR2=0
GOT_TERM=0
STOP_MSG=""
KEEPER=""
write_stop() {{
  [ -n "$RUN_DIR" ] || return 0  # a study between points: nothing runs to stop
  echo "preempted $STOP_MSG (job $SLURM_JOB_ID)" > "$RUN_DIR/.STOP.tmp" && mv -f "$RUN_DIR/.STOP.tmp" "$RUN_DIR/STOP"
}}
keep_stop() {{  # rank 0 clears the stop file as it starts: one written earlier is rewritten
  if [ -z "$KEEPER" ] && [ -n "${{SRUN_PID:-}}" ]; then
    ( while kill -0 "$SRUN_PID" 2>/dev/null; do [ -e "$RUN_DIR/STOP" ] || write_stop; sleep 2; done ) &
    KEEPER=$!
  fi
}}
request_stop() {{  # $1: what asked
  STOP_MSG=$1
  echo "[sbatch] $1 at $(date +%T): asking the ranks to checkpoint and stop${{RUN_DIR:+ ($RUN_DIR/STOP)}}"
  write_stop
  keep_stop
}}
trap 'GOT_USR2=1; request_stop "time limit near (SIGUSR2)"' USR2
trap 'GOT_TERM=1; request_stop "SIGTERM from SLURM"' TERM

# ---- The python check (job.sbatch calls it after its setup lines)
check_python() {{
{python_check}
}}

# ---- Waiting for srun
# bash runs a trap only between commands; a signal interrupts `wait`, so the loop waits in
# one-second pieces until srun has ended. Sets RC to srun's exit status.
# SLURM's SIGTERM reaches every process of the job, the subshell of a `$(...)` too: one it
# kills fails with status 143, which `set -e` would take for this script's own failure and
# end it there, its trap run or not. So no `$(...)` in here may end the script: each read
# that fails is taken again (`|| ...`), and the clock is bash's own (`printf '%(%s)T'`).
# A failed run (rank 0 wrote `failed` into summary.json, since srun started: a run that
# failed before and continues now says so until its rank 0 starts) ends srun within seconds
# (--kill-on-bad-exit), unless a node no longer answers (a cut link): srun then waits for
# that node until SLURM declares it dead (SlurmdTimeout: 60 s on the test cluster, 300 s by
# default). SRUN_GRACE_S after the failure the script stops waiting and the job ends; SLURM
# cleans the silent node up once it answers again.
SRUN_GRACE_S=10
wait_for_srun() {{  # $1: srun's pid
  SRUN_PID=$1
  [ -z "$STOP_MSG" ] || keep_stop  # the stop came before srun started
  local failed_s=0 since seen=0 mtime status=""
  printf -v since '%(%s)T' -1  # now, in seconds, without a subshell
  while kill -0 "$SRUN_PID" 2>/dev/null; do
    sleep 1 & wait $! || true
    mtime=$(stat -c %Y "$RUN_DIR/summary.json" 2>/dev/null) || mtime=0
    if [ "$mtime" != "$seen" ]; then  # read the status only when the file has changed
      status=$(run_status) && seen=$mtime  # a read a signal ended is taken again
    fi
    if [ "$mtime" -gt "$since" ] && [[ "$status" == failed* ]]; then
      failed_s=$((failed_s + 1))
    else
      failed_s=0
    fi
    if [ $failed_s -ge $SRUN_GRACE_S ] && kill -0 "$SRUN_PID" 2>/dev/null; then
      echo "[sbatch] the run failed and srun still waits after $failed_s s (a node that does not answer?): ending srun, the job ends"
      kill -9 "$SRUN_PID" 2>/dev/null || true
      wait "$SRUN_PID" 2>/dev/null || true
      RC=1
      [ -z "$KEEPER" ] || kill "$KEEPER" 2>/dev/null || true
      return
    fi
  done
  RC=0
  wait "$SRUN_PID" || RC=$?
  [ -z "$KEEPER" ] || kill "$KEEPER" 2>/dev/null || true
}}

# ---- After srun: requeue, or exit with its status
# After the time-limit stop the ranks checkpointed (status preempted): requeue this job, it
# continues from the checkpoint (train.resume=auto). A job SLURM itself ends (SIGTERM:
# cancelled, requeued by an admin, preempted) is left to SLURM: requeued, it resumes alike.
run_status() {{  # the run's status in its summary.json (completed, preempted, ...), or nothing
  {py} -c 'import json, sys; print(json.load(open(sys.argv[1])).get("status", ""))' \
    "$RUN_DIR/summary.json" 2>/dev/null || true
}}
requeue_or_exit() {{
  STATUS=$(run_status) || STATUS=$(run_status) || true  # once more if a signal ended it
  echo "[sbatch] srun ended at $(date +%T) with exit status $RC; run status: ${{STATUS:-unknown}}"
  [ "$STATUS" != completed ] || rm -f "$RUN_DIR/STOP"  # a stop that came too late is spent
  if [ "$STATUS" = preempted ] && [ "$GOT_TERM" = 0 ]; then
    AGAIN="sbatch ${{AGAIN_SCRIPT:-$RUN_DIR/job.sbatch}}"
    if [ "$SELF_REQUEUE" != 1 ]; then
      echo "[sbatch] stopped with a checkpoint; not requeueing (launcher.requeue=false): continue with: $AGAIN"
      exit 75
    fi
    if [ "$RESTART" -ge "$MAX_REQUEUES" ]; then
      echo "[sbatch] stopped with a checkpoint; requeued $RESTART time(s) already (launcher.max_requeues=$MAX_REQUEUES): continue with: $AGAIN"
      exit 75
    fi
    if ! command -v scontrol >/dev/null 2>&1; then
      echo "[sbatch] stopped with a checkpoint, but scontrol is not available here (inside a container, e.g. #SBATCH --environment?): cannot requeue; continue with: $AGAIN" | tee /dev/stderr
      exit 75
    fi
    trap - TERM USR2  # the requeue ends this allocation: SIGTERM comes back to this shell
    echo "[sbatch] requeueing job $SLURM_JOB_ID (restart $((RESTART + 1)) of at most $MAX_REQUEUES): it continues from the checkpoint"
    if scontrol requeue "$SLURM_JOB_ID"; then
      exit 0
    fi
    echo "[sbatch] scontrol requeue $SLURM_JOB_ID failed: continue with: $AGAIN" | tee /dev/stderr
    exit 75
  fi
  if [ "$GOT_TERM" = 1 ] && [ "$STATUS" = preempted ]; then
    echo "[sbatch] SLURM ended this allocation; the ranks saved a checkpoint: a requeued job continues from it by itself, else: sbatch ${{AGAIN_SCRIPT:-$RUN_DIR/job.sbatch}}"
  fi
  exit "$RC"
}}
