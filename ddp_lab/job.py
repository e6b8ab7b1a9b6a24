"""A job: its run folder, its ranks started through the launcher, its result. One path for
every entry point (training, benchmarks); nothing here knows what the ranks compute.

Submitting side, one process on the submitting machine, after `validate.resolve`:
    run_dir, rc = launch_job(cfg, label)     # run folder + config.yaml, render, start, follow
    summary = collect(run_dir, rc, **fields)  # summary.json, marked failed if the job failed
Rank side, every rank, as `python -m <run.entry> RUN_DIR`:
    rank_main(argv, module, maker, run)  ->  run_rank(run_dir, cfg, body)

The run folder is the job's identity: a reader of a folder (a `status` / reattach
command, a follower after requeues) and the ranks' stop handling belong here too.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

from omegaconf import DictConfig, open_dict

from .files import atomic_write_text, read_json_or_empty, write_json
from .rundir import make_run_dir, write_config


# ------------------------------------------------------------ submitting side
def make_run(cfg: DictConfig, label: str | None = None) -> Path:
    """The run folder, with the resolved config (run.dir set to it) written inside."""
    run_dir = make_run_dir(cfg, label=label)
    with open_dict(cfg):
        cfg.run.dir = str(run_dir)
    write_config(cfg, run_dir)
    return run_dir


def launch_job(cfg: DictConfig, label: str | None = None,
               files: Optional[dict[str, str]] = None) -> tuple[Path, Optional[int]]:
    """Make the run folder (with `files` written in it), render the launcher's files into
    it and, unless launcher.dry_run, start the job and follow it. Returns the folder and
    the job's exit status (None for a dry run). A launcher that refuses to render (a
    LaunchError) leaves no new folder behind."""
    from . import launch

    new = not cfg.run.dir or not Path(cfg.run.dir).expanduser().exists()
    run_dir = make_run(cfg, label)
    for name, text in (files or {}).items():
        atomic_write_text(run_dir / name, text)
    try:
        rendered = launch.render(cfg, run_dir)
    except launch.LaunchError:
        if new:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    rendered.write(run_dir)
    if cfg.launcher.dry_run:
        print(rendered.show.rstrip())
        print(f"run dir: {run_dir}")
        return run_dir, None
    try:
        # the trainer stops gracefully (a checkpoint first); a benchmark has nothing to save
        grace = cfg.dist.timeout_s + 60 if "train" in cfg else 0.0
        return run_dir, launch.start(rendered, run_dir, grace_s=grace)
    except launch.LaunchError as e:  # the folder stays: it holds what could not be started
        raise launch.LaunchError(f"{e} (run folder: {run_dir})") from None


def read_summary(run_dir: Path) -> dict:
    return read_json_or_empty(run_dir / "summary.json")


def mark_failed(run_dir: Path, status: str, fields: Optional[dict] = None) -> dict:
    """summary.json says `status` (a failure), keeping what it held (the run's segments,
    its last metrics) and closing the open segment; `fields` fill keys it lacks."""
    import datetime

    summary = read_summary(run_dir)
    summary["status"] = status
    for key, value in (fields or {}).items():
        summary.setdefault(key, value)
    segments = summary.get("segments")
    if isinstance(segments, list) and segments and isinstance(segments[-1], dict) \
            and segments[-1].get("status") == "running":
        segments[-1].update(status="failed", end=datetime.datetime.now(
            datetime.timezone.utc).astimezone().isoformat(timespec="seconds"))
    write_json(run_dir / "summary.json", summary)
    return summary


def collect(run_dir: Path, rc: int, **fields: Any) -> dict:
    """The job's summary.json after it ended with `rc`. A job that failed without saying
    so (no summary, or one that claims completion) is marked `failed: job exit status rc`,
    with `fields` filled in where the ranks did not write them."""
    summary = read_summary(run_dir)
    status = str(summary.get("status", ""))
    if rc != 0 and (not summary or status.startswith(("completed", "running"))):
        return mark_failed(run_dir, f"failed: job exit status {rc} (see {run_dir / 'logs'})", fields)
    if rc != 0 and any(k not in summary for k in fields):
        return mark_failed(run_dir, status, fields)
    return summary


# ------------------------------------------------------------------ rank side
def run_rank(run_dir: Path, cfg: Any, body: Callable[[Any], None], threads: int = 0,
             failure: Optional[dict] = None) -> int:
    """Run `body(ctx)` on this rank inside an initialised process group (env, logging,
    threads set up first); 0 on success, 1 after logging the failure (rank 0 also writes
    it to summary.json with `failure`'s fields) instead of a traceback."""
    import torch

    from .distributed import cpu_threads, distributed
    from .env import detect_env
    from .metrics import setup_logging

    env = detect_env()
    log = setup_logging(env, run_dir, cfg.log.level)
    torch.set_num_threads(cpu_threads(env, threads))
    try:
        with distributed(env, cfg.dist.backend, cfg.dist.device, cfg.dist.timeout_s) as ctx:
            body(ctx)
        return 0
    except Exception as e:  # noqa: BLE001 -- the log keeps the trace, the console the reason
        log.debug(traceback.format_exc())
        log.error("failed: %s: %s (traceback in %s)", type(e).__name__, e,
                  run_dir / "logs" / f"rank{env.rank}.log")
        if env.is_main:
            mark_failed(run_dir, f"failed: {type(e).__name__}: {e}",
                        {**(failure or {}), "world_size": env.world_size})
        return 1
    finally:
        logging.shutdown()


def rank_main(argv: Optional[list[str]], module: str, maker: str,
              run: Callable[[Path], int]) -> int:
    """`python -m <module> RUN_DIR`: check the argument, then `run(run_dir)`."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not (Path(argv[0]) / "config.yaml").is_file():
        print(f"usage: python -m {module} RUN_DIR  (a folder holding config.yaml, "
              f"as `{maker}` makes)", file=sys.stderr)
        return 2
    return run(Path(argv[0]).resolve())
