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

import logging
import os
import shutil
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

from omegaconf import DictConfig, open_dict

from .. import launch
from . import progress
from ..env import detect_env, openmp_wait_policy
from .files import atomic_write_text, write_json
from .metrics import fault_file, setup_logging
from .records import now_iso
from .rundir import make_run_dir, read_summary, write_config
from .stop import die_with_parent


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


def mark_failed(run_dir: Path, status: str, fields: Optional[dict] = None) -> dict:
    """summary.json says `status` (a failure), keeping what it held (the run's segments,
    its last metrics) and closing the open segment; `fields` fill keys it lacks."""
    summary = read_summary(run_dir)
    summary["status"] = status
    for key, value in (fields or {}).items():
        summary.setdefault(key, value)
    segments = summary.get("segments")
    if isinstance(segments, list) and segments and isinstance(segments[-1], dict) \
            and segments[-1].get("status") == "running":
        segments[-1].update(status="failed", end=now_iso())
    write_json(run_dir / "summary.json", summary)
    return summary


def collect(run_dir: Path, rc: int, **fields: Any) -> dict:
    """The job's summary.json after it ended with `rc`. A job that failed without saying
    so (no summary, or one that claims completion) is marked `failed: job exit status rc`,
    with `fields` filled in where the ranks did not write them."""
    summary = read_summary(run_dir)
    status = str(summary.get("status", ""))
    if rc != 0 and (not summary or status.startswith(("completed", "running"))):
        # rank 0 could not say it (it was the one that died): the progress records can
        why = (progress.failure_line(progress.diagnose(run_dir))
               or f"job exit status {rc} (see {run_dir / 'logs'})")
        return mark_failed(run_dir, f"failed: {why}", fields)
    if rc != 0 and any(k not in summary for k in fields):
        return mark_failed(run_dir, status, fields)
    return summary


# ------------------------------------------------------------------ rank side
def run_rank(run_dir: Path, cfg: Any, body: Callable[[Any], None], threads: int = 0,
             failure: Optional[dict] = None) -> int:
    """Run `body(ctx)` on this rank inside an initialised process group (env, logging,
    threads set up first); 0 on success, 1 after logging the failure (rank 0 also writes
    it to summary.json with `failure`'s fields) instead of a traceback.

    Dead and hung peers: the rank dies with its parent from the first instruction on
    (PR_SET_PDEATHSIG: torchrun killed during init), keeps its progress record
    (ddp_lab.run.progress) and its hang watchdog (stacks into its log). When a collective fails
    (a peer died, froze or hung past dist.timeout_s) its one `failed:` line names the rank(s)
    that stopped and where, and it kills those of this machine that cannot end themselves
    (a frozen rank would keep torchrun waiting 30 s more)."""
    # lazy: torch loads here, on the rank, after rank_main set OMP_WAIT_POLICY (libgomp
    # reads it once, at load: env.openmp_wait_policy); the submitting side needs no torch
    import torch

    from ..distributed import cpu_threads, distributed

    die_with_parent()
    env = detect_env()
    log = setup_logging(env, run_dir, cfg.log.level)
    record = progress.start(run_dir, env.rank, env.local_rank, env.world_size)
    timeout_s = float(cfg.dist.timeout_s)
    # a little before the peers' collectives time out, so a stuck rank's stack is in its log
    progress.set_watchdog(max(1.0, timeout_s - 2.0), fault_file())
    torch.set_num_threads(cpu_threads(env, threads))
    try:
        with distributed(env, cfg.dist.backend, cfg.dist.device, timeout_s,
                         cfg.dist.get("init_timeout_s"), run_dir) as ctx:
            record.state("running")
            body(ctx)
            record.phase("teardown")
        record.state("done")
        return 0
    except Exception as e:  # noqa: BLE001 -- the log keeps the trace, the console the reason
        _ignore_sigterm()  # torchrun's SIGTERM (another rank failed) must not cut this short
        progress.watchdog().cancel()
        mine = progress.short_error(e)
        here = record.snapshot()
        record.state("failed", mine)
        log.debug(traceback.format_exc())
        culprits = progress.diagnose(run_dir, me=env.rank, stale_s=min(5.0, timeout_s / 2))
        trace = run_dir / "logs" / f"rank{env.rank}.log"
        if culprits:
            line = progress.failure_line(culprits)
            at = f" at {progress.where(here)}" if here else ""
            log.error("failed: %s [rank %d: %s%s] (traceback in %s)", line, env.rank, mine, at, trace)
        else:
            line = mine
            log.error("failed: %s (traceback in %s)", mine, trace)
        if env.is_main:
            mark_failed(run_dir, f"failed: {line}",
                        {**(failure or {}), "world_size": env.world_size, "error": mine})
        killed = progress.end_stuck(culprits, run_dir, by=f"rank {env.rank}")
        if killed:
            log.error("killed stuck process(es) of this job: %s", killed)
        return 1
    finally:
        progress.watchdog().cancel()
        logging.shutdown()


def _ignore_sigterm() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def rank_main(argv: Optional[list[str]], module: str, maker: str,
              run: Callable[[Path], int]) -> int:
    """`python -m <module> RUN_DIR`: check the argument, then `run(run_dir)`."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not (Path(argv[0]) / "config.yaml").is_file():
        print(f"usage: python -m {module} RUN_DIR  (a folder holding config.yaml, "
              f"as `{maker}` makes)", file=sys.stderr)
        return 2
    openmp_wait_policy()  # before torch loads: libgomp reads it once (see there)
    rc = run(Path(argv[0]).resolve())
    if rc != 0:  # a failed rank's process group is broken: its teardown at exit can block
        sys.stdout.flush()  # seconds (gloo's pending calls), so leave without it
        sys.stderr.flush()
        os._exit(rc)
    return rc
