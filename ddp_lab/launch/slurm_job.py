"""A SLURM job after slurm.py rendered its script: submit it (`sbatch
--parsable`), then follow it through scontrol (or sacct once its record
aged out) to its final state, streaming its logs, a requeue included
(`follow`).
"""

from __future__ import annotations

import getpass
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from ..folder.stop import EXIT_STOPPED
from .base import LaunchError, Tail, diagnose, require_tool, should_wait

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def log_name(pattern: str, job_name: str, job_id: str) -> str:
    """sbatch's name of a `launcher.output` log: %x job name, %j id, %u
    user, %% '%'."""
    values = {"x": job_name, "j": str(job_id), "u": getpass.getuser(), "%": "%"}
    return re.sub(r"%([xju%])", lambda m: values[m.group(1)], pattern)


def submit_and_follow(cfg, run_dir: Path, script: Path, summary: str) -> int:
    lc = cfg.launcher
    sbatch = require_tool("sbatch", "run this on a SLURM login node")
    try:
        res = subprocess.run([sbatch, "--parsable", str(script)], capture_output=True,
                             text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise LaunchError("sbatch did not answer within 120 s: is slurmctld up? (sinfo)") from None
    if res.returncode != 0:
        raise LaunchError(f"sbatch refused the job: {res.stderr.strip() or res.stdout.strip()}")
    job_id = res.stdout.strip().split(";")[0]
    (run_dir / "job_id").write_text(job_id + "\n")
    name = log_name(lc.output, lc.job_name, job_id)
    out, err = run_dir / "logs" / f"{name}.out", run_dir / "logs" / f"{name}.err"
    print(f"submitted SLURM job {job_id}: {summary}\n  output: {out}\n  errors: {err}", flush=True)
    if not should_wait(lc.wait):
        print(f"not following it (launcher.wait=false): squeue -j {job_id}; tail -f {out}; "
              f"scancel {job_id}", flush=True)
        return 0
    return follow(job_id, out, err, lc.wait_timeout_s, lc.poll_s)


def job_info(job_id: str) -> dict:
    """scontrol's record of the job as a dict (JobState, ExitCode,
    Reason, Restarts, ...), else sacct's (JobState, ExitCode);
    {"JobState": "GONE"} when neither knows it, {"JobState": "UNKNOWN",
    "Reason": why} when they do not answer."""
    try:
        res = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                             text=True, timeout=15)
    except (subprocess.TimeoutExpired, OSError):
        return {"JobState": "UNKNOWN", "Reason": "scontrol did not answer"}
    if res.returncode == 0 and "JobState=" in res.stdout:
        return dict(tok.split("=", 1) for tok in res.stdout.split() if "=" in tok)
    if "Invalid job id" not in res.stderr:
        return {"JobState": "UNKNOWN", "Reason": res.stderr.strip()}
    # the record aged out of slurmctld (MinJobAge): accounting may still
    # know it
    try:
        acct = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,ExitCode"],
                              capture_output=True, text=True, timeout=15)
        line = acct.stdout.strip().splitlines()[0] if acct.returncode == 0 and acct.stdout.strip() else ""
    except (subprocess.TimeoutExpired, OSError):
        line = ""
    if line and "|" in line:
        state, code = line.split("|", 1)
        return {"JobState": state.split()[0], "ExitCode": code}
    return {"JobState": "GONE"}


def job_state(job_id: str) -> tuple[str, str, str]:
    """(state, ExitCode, Reason) of `job_info`."""
    info = job_info(job_id)
    return info.get("JobState", "UNKNOWN"), info.get("ExitCode", ""), info.get("Reason", "")


def exit_status(state: str, exit_code: str) -> int:
    """SLURM's ExitCode `code:signal` -> a shell exit status; non-zero
    for any failure."""
    try:
        code, sig = (int(x) for x in exit_code.split(":"))
    except ValueError:
        code, sig = 0, 0
    rc = code or (128 + sig if sig else 0)
    return rc if rc or state == "COMPLETED" else 1


# A failed job COMPLETING this long waits for a node that does not
# answer (it usually takes a second): `follow` reports it ended
STUCK_COMPLETING_S = 5.0
# States after which a --requeue job may still come back (PENDING
# again): wait and see.
MAYBE_REQUEUED = {"PREEMPTED", "NODE_FAIL"}
HINTS = {
    "BeginTime": "a requeued job waits before it starts again; `scontrol update JobId={j} "
                 "StartTime=now` starts it at once",
    "JobHeldUser": "held: `scontrol release {j}` lets it run",
    "JobHeldAdmin": "held by an admin",
}


def follow(job_id: str, out: Path, err: Path, timeout_s: Optional[float], poll_s: float,
           settle_s: float = 30.0) -> int:
    """Stream the job's logs and print each state change until it ends;
    its exit status. A requeued job (PENDING again, Restarts+1) goes on
    being followed; a requeueable job's PREEMPTED or NODE_FAIL (or any
    end just after a requeue) is final after `settle_s`."""
    tails = [Tail(out, sys.stdout), Tail(err, sys.stderr)]
    t0 = time.monotonic()
    last, restarts, unknown, since, requeued_at = None, None, 0, None, None
    completing = None
    state = code = ""
    try:
        while True:
            info = job_info(job_id)
            state, code = info.get("JobState", "UNKNOWN"), info.get("ExitCode", "")
            reason = info.get("Reason", "")
            for t in tails:
                t.poll()
            n = info.get("Restarts")
            if n is not None and n.isdigit():
                if restarts is not None and int(n) > restarts:
                    print(f"[slurm] job {job_id} requeued (restart {n}): it continues from "
                          "its checkpoint when it runs again", flush=True)
                    # show the state again, even when it did not change
                    last = None
                    requeued_at = time.monotonic()
                restarts = int(n)
            final = state in TERMINAL or state == "GONE"
            # the batch script ended with a failure and SLURM, for
            # seconds on end, still waits to clean up on a node that
            # does not answer (a cut link): over for its user
            if state == "COMPLETING" and code not in ("", "0:0"):
                completing = completing if completing is not None else time.monotonic()
                final = final or time.monotonic() - completing >= STUCK_COMPLETING_S
            else:
                completing = None
            # right after a requeue slurmctld may show the old
            # allocation's end (FAILED, CANCELLED) before the job is
            # PENDING again: that settles too
            just_requeued = requeued_at is not None and time.monotonic() - requeued_at < settle_s
            if final and (state in MAYBE_REQUEUED or just_requeued) and info.get("Requeue") == "1":
                since = since if since is not None else time.monotonic()
                final = time.monotonic() - since >= settle_s
            else:
                since = None
            shown = (state, reason if state == "PENDING" else "")
            if state == "PENDING" and reason in ("", "None") and last and last[0] == "PENDING":
                # a reason that clears is no news
                shown = last
            if shown != last and state not in ("UNKNOWN", "GONE") and not final:
                why = f" ({reason})" if reason and reason != "None" and (
                    state == "PENDING" or state in MAYBE_REQUEUED) else ""
                hint = HINTS.get(reason, "").format(j=job_id)
                if state == "REQUEUE_HOLD":
                    hint = HINTS["JobHeldUser"].format(j=job_id)
                print(f"[slurm] job {job_id} {state}{why}" + (f": {hint}" if hint else ""),
                      flush=True)
                last = shown
            if final:
                break
            unknown = unknown + 1 if state == "UNKNOWN" else 0
            if unknown * poll_s > 300:
                print(f"[slurm] slurmctld has not answered about job {job_id} for 5 min "
                      f"({reason}); not following it any more", file=sys.stderr)
                return 1
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                print(f"[slurm] job {job_id} still {state} after {timeout_s:.0f} s "
                      f"(launcher.wait_timeout_s): it keeps running; follow it with "
                      f"tail -f {out}, stop it with scancel {job_id}", file=sys.stderr)
                return 124
            time.sleep(poll_s)
    except KeyboardInterrupt:
        print(f"\n[slurm] stopped following; job {job_id} keeps running "
              f"(scancel {job_id} stops it)", file=sys.stderr)
        return 130
    # slurmd may still be flushing the job's output
    time.sleep(min(poll_s, 1.0))
    for t in tails:
        t.poll(final=True)
    if state == "GONE":
        print(f"[slurm] job {job_id} ended but neither scontrol nor sacct knows how: "
              f"see {out} and {err}", file=sys.stderr)
        return 1
    rc = exit_status(state, code)
    again = f" after {restarts} requeue(s)" if restarts else ""
    print(f"[slurm] job {job_id} {state}{again}, exit code {code or '?'}", flush=True)
    if state == "COMPLETING":
        print(f"[slurm] job {job_id} has ended; SLURM still cleans up on a node that does not "
              f"answer (squeue -j {job_id} shows it until then)", flush=True)
    # the batch shell: stopped with a checkpoint, not requeued
    if rc == EXIT_STOPPED:
        print(f"[slurm] job {job_id} stopped with a checkpoint and was not requeued (its log "
              f"says why): `sbatch` its job.sbatch again to continue", file=sys.stderr)
    elif rc != 0:
        print(f"[slurm] job {job_id} failed: {diagnose([err, out])}", file=sys.stderr)
    return rc
