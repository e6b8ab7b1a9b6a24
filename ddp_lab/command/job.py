"""A job: its run folder, its ranks started through the launcher, its result, for every entry point
(training, benchmarks); nothing here knows what the ranks compute. After `validate.resolve`:

    run_dir, rc = launch_job(cfg, label)     # run folder + config.yaml, render, start, follow
    summary = collect(run_dir, rc, **fields)  # summary.json, marked failed if the job failed
    return Outcome(rc, "ok" or "failed: why", run_dir)  # what a -m sweep's table shows

The ranks' side, every rank as `python -m <run.entry> RUN_DIR`, is rank/main.py.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, open_dict

from .. import launch
from ..folder import failure
from . import lock
from ..folder.files import atomic_write_text, write_json
from ..folder.description import TRAINER
from ..folder.rundir import (DRY_RUN, make_run_dir, mark_failed, read_summary, world_size,
    write_config)
from ..world.env import process_start

# Start-up (summary.json's segments[].startup_s) counts from the job's own start, as the user waits
# for it. The ranks read that start from DDP_LAB_T0: the first job of a command starts with the
# command (its imports count), each later one of a sweep or a study when the one before it ended
# (its caller passes `t0`). A scheduler's job (launchers/slurm.sbatch, runai_pod.sh) sets its own:
# the queue is not start-up.
T0_ENV = "DDP_LAB_T0"


@dataclass(frozen=True)
class Outcome:
    """How a job ended: the exit status, one line saying how ("ok", "failed: why", "stopped after
    ...") and its run folder (None when refused before one was made)."""
    rc: int
    result: str
    run_dir: Optional[Path] = None


def make_run(cfg: DictConfig, label: str | None = None) -> Path:
    """The run folder, with the resolved config (run.dir set to it) written inside."""
    run_dir = make_run_dir(cfg, label=label)
    with open_dict(cfg):
        cfg.run.dir = str(run_dir)
    write_config(cfg, run_dir)
    return run_dir


def launch_job(cfg: DictConfig, label: str | None = None,
               files: Optional[dict[str, str]] = None,
               t0: Optional[float] = None,
               limit_s: Optional[float] = None) -> tuple[Path, Optional[int]]:
    """Make the run folder (with `files` in it), render the launcher's files and, unless
    launcher.dry_run, start the job and follow it: (the folder, the exit status or None for a dry
    run). `limit_s`: see launch.start. A LaunchError leaves no new folder."""
    new = not cfg.run.dir or not Path(cfg.run.dir).expanduser().exists()
    run_dir = make_run_dir(cfg, label=label)
    # one command per folder (command/lock.py): a scheduler's job holds the lock after we exit
    scheduled = cfg.launcher.name in ("slurm", "runai") and not cfg.launcher.dry_run
    with lock.hold(run_dir, cfg.launcher.name, keep=scheduled):
        with open_dict(cfg):
            cfg.run.dir = str(run_dir)
        write_config(cfg, run_dir)
        for name, text in (files or {}).items():
            atomic_write_text(run_dir / name, text)
        try:
            rendered = launch.render(cfg, run_dir)
        except launch.LaunchError:
            if new:
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
        rendered.write(run_dir)
        # on the console, not buried in the script
        for warning in rendered.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        if cfg.launcher.dry_run:
            # a folder of its own: marked, so no one counts it as a run
            if new:
                atomic_write_text(run_dir / DRY_RUN, "rendered by launcher.dry_run=true: nothing "
                                  "was started here; the same command without it runs it\n")
            print(rendered.show.rstrip())
            print("a dry run: rendered, not started (the same command without "
                  "launcher.dry_run=true starts it)")
            print(f"run dir: {run_dir}")
            return run_dir, None
        (run_dir / DRY_RUN).unlink(missing_ok=True)
        world = world_size(cfg)
        # the first line, at once
        print(f"[ddp_lab] starting {f'{world} rank(s)' if world else 'the job'} "
              f"({cfg.launcher.name}) in {run_dir}", flush=True)
        # the ranks (and scripts) inherit it
        os.environ[T0_ENV] = repr(t0 or process_start() or time.time())
        try:
            # the trainer stops gracefully (a checkpoint first); a benchmark has nothing to save
            grace = cfg.dist.timeout_s + 60 if "train" in cfg else 0.0
            rc = launch.start(rendered, run_dir, grace_s=grace, limit_s=limit_s)
        except launch.LaunchError as e:
            # the folder stays: it holds what could not be started
            raise launch.LaunchError(f"{e} (run folder: {run_dir})") from None
        why = rendered.explain() if rc and rendered.explain else None
        # the launcher failed before any rank started: its line is the run's status
        if why:
            mark_failed(run_dir, f"failed: {why}")
        return run_dir, rc


def collect(run_dir: Path, rc: int, **fields: Any) -> dict:
    """The job's summary.json after it ended with `rc`. A job that failed without saying so (no
    summary, or one that claims completion) is marked `failed: job exit status rc`, with `fields`
    filled in where the ranks did not write them."""
    summary = read_summary(run_dir)
    status = str(summary.get("status", ""))
    entry = fields.pop("entry", None)
    if entry not in (None, TRAINER) and not summary:
        # a run.entry that keeps no records (ddp_lab.rank.one_file): still a run, ended as its exit
        # status says; the report and status say why it has no figures
        fields.update(entry=entry, records_kept=False)
        if rc == 0:
            summary = {"status": "completed", **fields}
            write_json(run_dir / "summary.json", summary)
            return summary
    if rc != 0 and (not summary or status.startswith(("completed", "running"))):
        # rank 0 could not say it (it was the one that died): the heartbeat records can
        why = (failure.failure_line(failure.diagnose(run_dir))
               or f"job exit status {rc} (see {run_dir / 'logs'})")
        return mark_failed(run_dir, f"failed: {why}", fields)
    if rc != 0 and any(k not in summary for k in fields):
        return mark_failed(run_dir, status, fields)
    return summary
