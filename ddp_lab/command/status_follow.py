"""`python -m ddp_lab.status RUN_DIR --follow`: the run's logs and state
until it ends."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..launch import Tail, slurm_job
from .status import SLURM_ALIVE, dead, inspect
from ..folder.stop import EXIT_STOPPED
from .status_screen import continue_lines, render, run_reached, to_continue


def exit_code(info: dict) -> int:
    """0 completed, 75 preempted/stopped (continue it), 1 failed (or
    dead)."""
    return {"completed": 0, "preempted": EXIT_STOPPED, "stopped": EXIT_STOPPED}.get(info["state"], 1)


def follow(run_dir: Path, poll_s: float = 1.0, out=None) -> int:
    """Print what the run's logs gain and its state changes until it
    ends; see exit_code."""
    out = out or sys.stdout
    info = inspect(run_dir)
    print(render(info), file=out, flush=True)
    if info["launcher"] == "slurm" and info["job_id"] and info["scheduler"] \
            and info["scheduler"]["state"] in SLURM_ALIVE:
        return _follow_slurm(run_dir, info, poll_s, out)
    return _follow_local(run_dir, info, poll_s, out)


def _final_line(info: dict) -> str:
    line = f"[status] {info['state']} after {run_reached(info)}"
    if info["detail"] and info["state"] != "completed":
        line += f" ({info['detail']})"
    if info["state"] == "completed" and isinstance(info["test_accuracy"], (int, float)):
        line += f", test accuracy {info['test_accuracy']:.4f}"
    if to_continue(info):
        line += "\n" + continue_lines(info)
    return line


def _follow_slurm(run_dir: Path, info: dict, poll_s: float, out) -> int:
    out_log, err_log = (Path(p) for p in info["logs"][:2]) if len(info["logs"]) >= 3 else (
        run_dir / "logs" / f"ddp_lab_{info['job_id']}.out",
        run_dir / "logs" / f"ddp_lab_{info['job_id']}.err")
    rc = slurm_job.follow(info["job_id"], out_log, err_log, None, poll_s)
    # not followed to the end: the job lives on
    if rc in (124, 130):
        return rc
    info = _settled(run_dir)
    print(_final_line(info), file=out, flush=True)
    return exit_code(info)


def _settled(run_dir: Path, wait_s: float = 10.0) -> dict:
    """The state once the job's last writes are in (summary.json lags a
    job's end a bit)."""
    deadline = time.monotonic() + wait_s
    info = inspect(run_dir)
    while info["state"] in ("running", "pending") and time.monotonic() < deadline:
        time.sleep(0.5)
        info = inspect(run_dir)
    return info


def _follow_local(run_dir: Path, info: dict, poll_s: float, out) -> int:
    tail = Tail(run_dir / "logs" / "rank0.log", out)
    # new lines only: the state above showed where it is
    try:
        tail.pos = tail.path.stat().st_size
    except OSError:
        pass
    last = (info["state"], info["detail"])
    quiet = 0
    try:
        while True:
            if info["state"] not in ("running", "pending") or dead(info):
                # seen twice, a poll apart: not a gap between two
                # processes
                if dead(info):
                    quiet += 1
                    if quiet < 2:
                        time.sleep(poll_s)
                        info = inspect(run_dir)
                        continue
                elif info["processes"]:
                    # final status written, processes still exiting
                    time.sleep(poll_s)
                    info = inspect(run_dir)
                    if info["processes"] and quiet < 30:
                        quiet += 1
                        continue
                break
            quiet = 0
            time.sleep(poll_s)
            tail.poll()
            info = inspect(run_dir)
            now = (info["state"], info["detail"])
            if now != last and info["state"] in ("running", "pending"):
                print(f"[status] {now[0]}" + (f" ({now[1]})" if now[1] else ""), file=out, flush=True)
            last = now
    except KeyboardInterrupt:
        print(f"\n[status] stopped following; the run goes on (python -m ddp_lab.status "
              f"{run_dir} --stop ends it)", file=sys.stderr)
        return 130
    tail.poll(final=True)
    if info["state"] == "not started":
        print(f"[status] {run_dir}: not started ({info['detail']}): nothing to follow",
              file=out, flush=True)
        return 1
    print(_final_line(info), file=out, flush=True)
    return exit_code(info)
