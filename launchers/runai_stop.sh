#!/usr/bin/env bash
# ddp_lab: what pod.sh (beside this file) does besides starting torchrun: it sources this file
# before its setup lines, so that the trap catches a SIGTERM at any time. Not run by itself.
#   check_python       the ranks' python imports what they run, else the pod ends (exit 3)
#   exit_if_stopped    a stop during the setup ends the pod before torchrun starts
#   wait_for_torchrun  wait for torchrun, in the background so that the trap runs at once
#   end_pod            the pod's exit status, in RUN_DIR/logs/pod<N>.exit for launcher.wait
# (A dry run prints these `#   name` lines in place of this file: launch/base.py sourced_note.)
#
# Preemption: Kubernetes stops a pod with SIGTERM to pod.sh (PID 1), then SIGKILL after the
# grace period (30 s by default). The trap below turns SIGTERM into a graceful stop: every
# rank of every pod checkpoints and exits 0, and the pod exits {preempted_exit} ("not finished"), so
# Kubernetes / RunAI start the pod again; the new pod continues from the checkpoint by itself
# (train.resume=auto). Exit status: 0 = the run completed (or a person stopped it),
# {preempted_exit} = preempted (continue later), anything else = torchrun's failure.
PREEMPTED_EXIT={preempted_exit}
# summary.json names the allocation (each start of the pods is a segment) after the job
export DDP_LAB_JOB_ID=${{DDP_LAB_JOB_ID:-{job_name}}}

mkdir -p "$RUN_DIR/logs"
# A re-created pod (after a preemption or an eviction) is not finished: its previous exit
# status goes, or launcher.wait (which follows these files) would take it for the end.
rm -f "$RUN_DIR/logs/pod$POD_RANK.exit"
# the pod's output also goes to the run folder (appended: a re-created pod adds to it);
# `runai logs` loses it after a while
exec > >(tee -a "$RUN_DIR/logs/pod$POD_RANK.log") 2>&1
TEE_PID=$!
say() {{ echo "[pod $POD_RANK/$PODS] $(date +%H:%M:%S) $*"; }}
say "$(hostname): master $MASTER_ADDR:$MASTER_PORT, $NPROC_PER_NODE process(es)"

# ---- graceful stop
# SIGTERM (Kubernetes: preemption, eviction, `runai delete`) or SIGINT writes the stop file
# RUN_DIR/STOP, atomically: rank 0 reads it at its next check (train.stop_check_s), all ranks
# of all pods agree to stop after the same step, save a checkpoint and exit 0, so torchrun
# ends normally. The signal is not forwarded to torchrun: its agent would SIGTERM its own
# workers only and exit 1 with a SignalException traceback; the file reaches every pod (the
# run folder is shared) and also ranks still starting up (a starting rank 0 clears old
# requests: the wait loop below writes it again). A second signal ends torchrun at once.
STOP_WANTED=""
TORCHRUN_PID=""
write_stop() {{
  local tmp="$RUN_DIR/.STOP.pod$POD_RANK.tmp"
  echo "$STOP_WANTED" > "$tmp" && mv -f "$tmp" "$RUN_DIR/STOP"
}}
on_signal() {{  # $1: TERM | INT
  if [ -n "$STOP_WANTED" ]; then
    say "SIG$1 again: ending torchrun now"
    if [ -n "$TORCHRUN_PID" ]; then kill -TERM "$TORCHRUN_PID" 2>/dev/null || true; fi
    return 0
  fi
  local status=preempted
  if [ "$1" = INT ]; then status=stopped; fi
  STOP_WANTED="$status SIG$1 to pod $POD_RANK ($(hostname))"
  write_stop || say "could not write $RUN_DIR/STOP"
  say "SIG$1: every rank stops at its next check and saves a checkpoint"
}}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

# launcher.wait follows these files from the submitting machine (the run folder is shared)
finish() {{  # $1: exit status
  say "exit status $1"
  exec >&- 2>&-  # the log is complete before the exit file says so
  wait "$TEE_PID" 2>/dev/null || true
  echo "$1" > "$RUN_DIR/logs/.pod$POD_RANK.exit.tmp"
  mv -f "$RUN_DIR/logs/.pod$POD_RANK.exit.tmp" "$RUN_DIR/logs/pod$POD_RANK.exit"
  exit "$1"
}}

# ---- The python check (pod.sh calls it after its setup lines)
check_python() {{
{python_check}
}}

# the run's status once rank 0 (maybe on another pod) has written it: not "running"
run_status() {{
  local status="" i
  for i in $(seq 20); do
    status=$({python} -c 'import json, sys
try:
    print(json.load(open(sys.argv[1])).get("status", ""))
except (OSError, ValueError):
    print("")' "$RUN_DIR/summary.json")
    if [ -n "$status" ] && [ "$status" != running ]; then break; fi
    sleep 0.5
  done
  echo "$status"
}}

exit_if_stopped() {{
  if [ -n "$STOP_WANTED" ]; then  # stopped while setting up: training never started
    if [[ $STOP_WANTED == preempted* ]]; then finish "$PREEMPTED_EXIT"; else finish 130; fi
  fi
}}

# ---- Waiting for torchrun
# bash runs traps only between commands; `wait` returns early for one. Sets rc.
wait_for_torchrun() {{  # $1: torchrun's pid
  TORCHRUN_PID=$1
  rc=""
  while [ -z "$rc" ]; do
    if [ -n "$STOP_WANTED" ]; then  # keep the request in place until torchrun is done
      if kill -0 "$TORCHRUN_PID" 2>/dev/null; then
        if [ ! -e "$RUN_DIR/STOP" ]; then write_stop || true; fi
        sleep 1
        continue
      fi
    fi
    wait "$TORCHRUN_PID" && rc=0 || rc=$?
    if kill -0 "$TORCHRUN_PID" 2>/dev/null; then rc=""; fi  # a trapped signal ended the wait
  done
}}

# ---- After torchrun: did the run complete, or stop to continue later?
end_pod() {{
  say "torchrun ended with exit status $rc"
  if [ "$rc" = 0 ]; then
    case "$(run_status)" in
      preempted) rc=$PREEMPTED_EXIT ;;
      completed|stopped) ;;
      *) if [[ $STOP_WANTED == preempted* ]]; then rc=$PREEMPTED_EXIT; fi ;;  # no summary: our signal decides
    esac
    if [ "$rc" != 0 ]; then
      say "the run was preempted (checkpoint saved): exit $rc, so that the pod starts again and continues"
    fi
  fi
  finish "$rc"
}}
