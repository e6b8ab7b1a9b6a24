"""`python -m ddp_lab.status PATH [--follow | --stop] [--json]`: reattach to a run from any shell.

    python -m ddp_lab.status outputs/             # one line per run
    python -m ddp_lab.status RUN_DIR --follow     # its logs and state until it ends
    python -m ddp_lab.status RUN_DIR --stop       # every rank checkpoints, then the job ends

The state and its screen: command/status.py; this module is the command (docs/status.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections import Counter
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from .command.status import (FINAL, SLURM_ALIVE, SLURM_WAITING, continue_lines, dead, dry_runs,
    find_runs, inspect, one_line, render, run_reached, state_said, to_continue)
from .config.errors import UserError
from .folder.rundir import EXIT_STOPPED, request_stop, STOP_FILE
from .launch import job_processes, slurm
from .launch.base import Tail

USAGE = "python -m ddp_lab.status RUN_DIR [--follow | --stop] [--json]"


class _Parser(argparse.ArgumentParser):
    # one line, exit 2 (argparse prints usage on two)
    def error(self, message: str):
        raise UserError(f"{message} (usage: {USAGE})")


def _parse(argv: Optional[list[str]]) -> argparse.Namespace:
    ap = _Parser(prog="python -m ddp_lab.status",
                 description="Show a run's state (or one line per run of a folder), follow it "
                             "to its end, or stop it gracefully (checkpoint first).")
    ap.add_argument("path", metavar="RUN_DIR",
                    help="a run folder (printed as `run dir: PATH`), or a folder of runs")
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--follow", action="store_true",
                     help="print the logs and state changes until the run ends; exit 0 "
                          "completed, 75 preempted/stopped, 1 failed")
    how.add_argument("--stop", action="store_true",
                     help="every rank checkpoints at its next check and exits; a SLURM job "
                          "is then cancelled")
    ap.add_argument("--json", action="store_true", help="the state as JSON (not with --follow/--stop)")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="--stop: seconds to wait for the checkpoint (default 300)")
    ap.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.json and (args.follow or args.stop):
        raise UserError("--json shows the state only: drop --follow/--stop, or --json")
    if args.timeout <= 0 or args.poll <= 0:
        raise UserError("--timeout must be > 0 seconds")
    return args


def resolve_path(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.exists():
        raise UserError(f"{text}: no such folder: give a run folder (the `run dir: PATH` a run "
                        "prints) or a folder of runs such as outputs/")
    if not path.is_dir():
        raise UserError(f"{text} is a file, not a folder: give its run folder "
                        f"({path.parent}?) or a folder of runs")
    return path.resolve()


def main(argv: Optional[list[str]] = None) -> int:
    try:
        args = _parse(argv)
        path = resolve_path(args.path)
        runs = find_runs(path)
        if not runs and dry_runs(path):
            raise UserError(f"{args.path} holds only dry runs ({dry_runs(path)}): rendered, "
                            "never started; run the same command without launcher.dry_run=true")
        if not runs:
            raise UserError(f"{args.path} holds no run folder (no config.yaml in it or below): "
                            "give a run folder (the `run dir: PATH` a run prints) or a folder of runs")
        if (args.follow or args.stop) and runs != [path]:
            what = "--follow" if args.follow else "--stop"
            raise UserError(f"{what} takes one run folder; {args.path} holds {len(runs)} run(s): "
                            f"give one of them, e.g. {runs[0]}")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.follow:
        return follow(path, args.poll)
    if args.stop:
        return stop(path, args.timeout, args.poll)
    infos = [inspect(r) for r in runs]
    if args.json:
        print(json.dumps(infos[0] if runs == [path] else infos, indent=2, default=str))
    elif runs == [path]:
        print(render(infos[0]))
    else:
        for info in infos:
            print(one_line(info))
        states = Counter(info["state"] for info in infos)
        dry = dry_runs(path)
        print(f"{len(infos)} run(s) under {path}: "
              + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
              + (f" ({dry} dry run(s) not counted)" if dry else ""))
    return 0


def exit_code(info: dict) -> int:
    """0 completed, 75 preempted/stopped (continue it), 1 failed (or dead)."""
    return {"completed": 0, "preempted": EXIT_STOPPED, "stopped": EXIT_STOPPED}.get(info["state"], 1)


def follow(run_dir: Path, poll_s: float = 1.0) -> int:
    """Print what the run's logs gain and its state changes until it ends; see exit_code."""
    info = inspect(run_dir)
    print(render(info), flush=True)
    if info["launcher"] == "slurm" and info["job_id"] and info["scheduler"] \
            and info["scheduler"]["state"] in SLURM_ALIVE:
        return _follow_slurm(run_dir, info, poll_s)
    return _follow_local(run_dir, info, poll_s)


def _final_line(info: dict) -> str:
    line = f"[status] {info['state']} after {run_reached(info)}"
    if info["detail"] and info["state"] != "completed":
        line += f" ({info['detail']})"
    if info["state"] == "completed" and isinstance(info["test_accuracy"], (int, float)):
        line += f", test accuracy {info['test_accuracy']:.4f}"
    if to_continue(info):
        line += "\n" + continue_lines(info)
    return line


def _follow_slurm(run_dir: Path, info: dict, poll_s: float) -> int:
    out_log, err_log = (Path(p) for p in info["logs"][:2]) if len(info["logs"]) >= 3 else (
        run_dir / "logs" / f"ddp_lab_{info['job_id']}.out",
        run_dir / "logs" / f"ddp_lab_{info['job_id']}.err")
    rc = slurm.follow(info["job_id"], out_log, err_log, None, poll_s)
    # not followed to the end: the job lives on
    if rc in (124, 130):
        return rc
    info = _settled(run_dir)
    print(_final_line(info), flush=True)
    return exit_code(info)


def _settled(run_dir: Path, wait_s: float = 10.0) -> dict:
    """The state once the job's last writes are in (summary.json lags a job's end a bit)."""
    deadline = time.monotonic() + wait_s
    info = inspect(run_dir)
    while info["state"] in ("running", "pending") and time.monotonic() < deadline:
        time.sleep(0.5)
        info = inspect(run_dir)
    return info


def _follow_local(run_dir: Path, info: dict, poll_s: float) -> int:
    tail = Tail(run_dir / "logs" / "rank0.log", sys.stdout)
    # new lines only: the state above showed where it is
    with contextlib.suppress(OSError):
        tail.pos = tail.path.stat().st_size
    last = (info["state"], info["detail"])
    quiet = 0
    try:
        while True:
            if info["state"] in ("running", "pending") and not dead(info):
                quiet = 0
            elif dead(info):
                # seen twice, a poll apart: not a gap between two processes
                quiet += 1
                if quiet >= 2:
                    break
            elif info["processes"] and quiet < 30:
                # final status written, processes still exiting
                quiet += 1
            else:
                break
            time.sleep(poll_s)
            tail.poll()
            info = inspect(run_dir)
            now = (info["state"], info["detail"])
            if now != last and info["state"] in ("running", "pending"):
                print(f"[status] {state_said(info)}", flush=True)
            last = now
    except KeyboardInterrupt:
        print(f"\n[status] stopped following; the run goes on (python -m ddp_lab.status "
              f"{run_dir} --stop ends it)", file=sys.stderr)
        return 130
    tail.poll(final=True)
    if info["state"] == "not started":
        print(f"[status] {run_dir}: not started ({info['detail']}): nothing to follow", flush=True)
        return 1
    print(_final_line(info), flush=True)
    return exit_code(info)


def stop(run_dir: Path, timeout_s: float = 300.0, poll_s: float = 1.0) -> int:
    """Ask every rank to checkpoint and stop; wait for it; end what is left of a SLURM job."""
    info = inspect(run_dir)
    alive_in_slurm = info["launcher"] == "slurm" and info["scheduler"] is not None \
        and info["scheduler"]["state"] in SLURM_ALIVE
    if alive_in_slurm and info["state"] in FINAL:
        # the ranks have ended (a batch script finishing, or about to requeue itself)
        _end_slurm_job(info, grace_s=15.0, poll_s=poll_s)
        print(f"[status] {info['state']} after {run_reached(info)}")
        print(continue_lines(info))
        return 0
    if info["state"] not in ("running", "pending") or dead(info):
        print(f"[status] nothing to stop: {state_said(info)}")
        if to_continue(info):
            print(continue_lines(info))
        return 0 if info["state"] in FINAL else 1
    if alive_in_slurm and info["scheduler"]["state"] in SLURM_WAITING and info["state"] == "pending":
        # nothing runs: no rank to checkpoint (a new segment would clear the stop file anyway)
        _scancel(info["job_id"])
        print(f"[status] cancelled SLURM job {info['job_id']} while it was "
              f"{info['scheduler']['state']}; the run folder keeps {run_reached(info)}")
        print(continue_lines(info))
        return 0
    reason = "python -m ddp_lab.status --stop"
    request_stop(run_dir, "stopped", reason)
    print(f"[status] asked {run_dir} to stop: every rank checkpoints at its next check "
          f"(waiting up to {timeout_s:.0f} s)", flush=True)
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
        _end_slurm_job(info, grace_s=0 if not stopped else 15.0, poll_s=poll_s)
    elif stopped:
        # local: the ranks have exited; let the launcher finish
        end = time.monotonic() + 30
        while job_processes(run_dir) and time.monotonic() < end:
            time.sleep(poll_s)
        left = job_processes(run_dir)
        if left:
            print(f"[status] {len(left)} process(es) of the job still alive: {left}")
    info = inspect(run_dir)
    if not stopped:
        print(f"[status] the run did not stop within {timeout_s:.0f} s (state {info['state']}"
              + (f": {info['detail']}" if info["detail"] else "") + ")")
        if info["processes"]:
            print(f"[status] its processes here: {info['processes']} (kill them to end it; "
                  f"it resumes from {info['checkpoint'] or 'the start'})")
        return 1
    print(f"[status] {info['state']} after {run_reached(info)}"
          + (f" ({info['stop_reason']})" if info["stop_reason"] else "")
          + (f"; checkpoint {info['checkpoint']}" if info["checkpoint"] else ""))
    if info["state"] != "completed":
        print(continue_lines(info))
    return 0


def _end_slurm_job(info: dict, grace_s: float, poll_s: float) -> None:
    """Give the job `grace_s` to end by itself once its ranks have stopped, then cancel it."""
    end = time.monotonic() + grace_s
    while (state := slurm.job_info(info["job_id"]).get("JobState", "UNKNOWN")) in SLURM_ALIVE \
            and time.monotonic() < end:
        time.sleep(poll_s)
    if state in SLURM_ALIVE:
        _scancel(info["job_id"])
    else:
        print(f"[status] SLURM job {info['job_id']} ended by itself ({state})")


def _scancel(job_id: str) -> None:
    exe = shutil.which("scancel")
    if exe is None:
        print(f"[status] scancel not found: cancel SLURM job {job_id} where SLURM runs")
        return
    res = subprocess.run([exe, job_id], capture_output=True, text=True, timeout=60)
    print(f"[status] scancel {job_id}" + ("" if res.returncode == 0 else
                                          f": {res.stderr.strip() or res.returncode}"))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        # `... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
