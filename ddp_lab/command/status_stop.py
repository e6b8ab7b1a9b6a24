"""`python -m ddp_lab.status RUN_DIR --stop`: every rank checkpoints,
then the job ends."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..launch import slurm_job
from .status import FINAL, SLURM_ALIVE, SLURM_WAITING, dead, inspect, live_processes
from ..folder.stop import STOP_FILE, request_stop
from .status_screen import continue_lines, run_reached, to_continue


def stop(run_dir: Path, timeout_s: float = 300.0, poll_s: float = 1.0, out=None) -> int:
    """Ask every rank to checkpoint and stop; wait for it; end what is
    left of a SLURM job."""
    out = out or sys.stdout
    info = inspect(run_dir)
    alive_in_slurm = info["launcher"] == "slurm" and info["scheduler"] is not None \
        and info["scheduler"]["state"] in SLURM_ALIVE
    if alive_in_slurm and info["state"] in FINAL:
        # the ranks have ended (a batch script finishing, or about to
        # requeue itself)
        _end_slurm_job(run_dir, info, out, grace_s=15.0, poll_s=poll_s)
        print(f"[status] {info['state']} after {run_reached(info)}", file=out)
        print(continue_lines(info), file=out)
        return 0
    if info["state"] not in ("running", "pending") or dead(info):
        print(f"[status] nothing to stop: {info['state']}"
              + (f" ({info['detail']})" if info["detail"] else ""), file=out)
        if to_continue(info):
            print(continue_lines(info), file=out)
        return 0 if info["state"] in FINAL else 1
    if alive_in_slurm and info["scheduler"]["state"] in SLURM_WAITING and info["state"] == "pending":
        # nothing runs: no rank to checkpoint (a new segment would clear
        # the stop file anyway)
        _scancel(info["job_id"], out)
        print(f"[status] cancelled SLURM job {info['job_id']} while it was "
              f"{info['scheduler']['state']}; the run folder keeps {run_reached(info)}", file=out)
        print(continue_lines(info), file=out)
        return 0
    reason = "python -m ddp_lab.status --stop"
    request_stop(run_dir, "stopped", reason)
    print(f"[status] asked {run_dir} to stop: every rank checkpoints at its next check "
          f"(waiting up to {timeout_s:.0f} s)", file=out, flush=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        info = inspect(run_dir)
        if info["state"] in FINAL or dead(info) or info["state"] == "not started":
            break
        # a segment starting now cleared it: again
        if not (run_dir / STOP_FILE).exists():
            request_stop(run_dir, "stopped", reason)
    else:
        info = inspect(run_dir)
    stopped = info["state"] in FINAL
    if info["launcher"] == "slurm" and info["job_id"]:
        _end_slurm_job(run_dir, info, out, grace_s=0 if not stopped else 15.0, poll_s=poll_s)
    elif stopped:
        # local: the ranks have exited; let the launcher finish
        end = time.monotonic() + 30
        while live_processes(run_dir) and time.monotonic() < end:
            time.sleep(poll_s)
        left = live_processes(run_dir)
        if left:
            print(f"[status] {len(left)} process(es) of the job still alive: {left}", file=out)
    info = inspect(run_dir)
    if not stopped:
        print(f"[status] the run did not stop within {timeout_s:.0f} s (state {info['state']}"
              + (f": {info['detail']}" if info["detail"] else "") + ")", file=out)
        if info["processes"]:
            print(f"[status] its processes here: {info['processes']} (kill them to end it; "
                  f"it resumes from {info['checkpoint'] or 'the start'})", file=out)
        return 1
    print(f"[status] {info['state']} after {run_reached(info)}"
          + (f" ({info['stop_reason']})" if info["stop_reason"] else "")
          + (f"; checkpoint {info['checkpoint']}" if info["checkpoint"] else ""), file=out)
    if info["state"] != "completed":
        print(continue_lines(info), file=out)
    return 0


def _end_slurm_job(run_dir: Path, info: dict, out, grace_s: float, poll_s: float) -> None:
    """The ranks have checkpointed (or did not in time): give the job
    `grace_s` to end by itself, then cancel it."""
    end = time.monotonic() + grace_s
    state = slurm_job.job_state(info["job_id"])[0]
    while state in SLURM_ALIVE and time.monotonic() < end:
        time.sleep(poll_s)
        state = slurm_job.job_state(info["job_id"])[0]
    if state in SLURM_ALIVE:
        _scancel(info["job_id"], out)
    else:
        print(f"[status] SLURM job {info['job_id']} ended by itself ({state})", file=out)


def _scancel(job_id: str, out) -> None:
    exe = shutil.which("scancel")
    if exe is None:
        print(f"[status] scancel not found: cancel SLURM job {job_id} where SLURM runs", file=out)
        return
    res = subprocess.run([exe, job_id], capture_output=True, text=True, timeout=60)
    print(f"[status] scancel {job_id}" + ("" if res.returncode == 0 else
                                          f": {res.stderr.strip() or res.returncode}"), file=out)
