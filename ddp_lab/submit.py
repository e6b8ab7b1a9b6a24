"""The submitting side of a run: resolve defaults, make the run folder, launch, report."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig, open_dict

from . import launch
from .metrics import write_json
from .rundir import make_run_dir, write_config

log = logging.getLogger("ddp_lab.submit")


class UserError(Exception):
    """A mistake in the command line or config: printed as one line, no traceback."""


def resolve_defaults(cfg: DictConfig) -> DictConfig:
    """Fill what depends on this machine and make paths absolute (ranks may start
    elsewhere: every rank must read the same absolute folders)."""
    cfg = cfg.copy()
    with open_dict(cfg):
        try:
            launch.resolve(cfg)  # the launcher's own defaults and checks (hosts, tasks, ...)
        except launch.LaunchError as e:
            raise UserError(str(e)) from None
        if cfg.launcher.nproc_per_node is None:
            cfg.launcher.nproc_per_node = launch.default_nproc()
        cfg.data.root = str(Path(cfg.data.root).expanduser().resolve())
        cfg.data.mirrors = [m if m == "embedded" or "://" in m else str(Path(m).expanduser().resolve())
                            for m in cfg.data.mirrors]
    _validate(cfg)
    return cfg


def check_all(checks: list[tuple[bool, str]]) -> None:
    """Raise the first failed check's message as a UserError."""
    for ok, message in checks:
        if not ok:
            raise UserError(message)


def common_checks(cfg: DictConfig) -> list[tuple[bool, str]]:
    """The checks every entry point (training, bench) makes of launcher, dist and log."""
    return [
        (cfg.launcher.nodes >= 1, f"launcher.nodes={cfg.launcher.nodes}: must be >= 1"),
        (cfg.launcher.nproc_per_node >= 1,
         f"launcher.nproc_per_node={cfg.launcher.nproc_per_node}: must be >= 1"),
        (cfg.dist.backend in ("auto", "gloo", "nccl"),
         f"dist.backend={cfg.dist.backend}: choose auto, gloo or nccl"),
        (cfg.dist.device in ("auto", "cpu", "cuda"),
         f"dist.device={cfg.dist.device}: choose auto, cpu or cuda"),
        (cfg.log.progress in ("auto", "bar", "lines"),
         f"log.progress={cfg.log.progress}: choose auto, bar or lines"),
    ]


def _validate(cfg: DictConfig) -> None:
    check_all([
        (cfg.train.epochs >= 1, f"train.epochs={cfg.train.epochs}: must be >= 1"),
        (cfg.train.batch_size >= 1, f"train.batch_size={cfg.train.batch_size}: must be >= 1"),
        (cfg.train.lr > 0, f"train.lr={cfg.train.lr}: must be > 0"),
        *common_checks(cfg),
        (cfg.data.pipeline in ("tensor", "dataloader"),
         f"data.pipeline={cfg.data.pipeline}: choose tensor or dataloader"),
        (len(cfg.data.mirrors) > 0, "data.mirrors is empty: give at least one (default: [embedded])"),
        (not cfg.train.resume or cfg.run.dir,
         "train.resume=true needs run.dir=PATH, the run folder to continue"),
    ])
    _validate_sync_and_timing(cfg)
    if cfg.train.resume and not (Path(cfg.run.dir) / "checkpoints").is_dir():
        raise UserError(f"train.resume=true but {cfg.run.dir}/checkpoints does not exist: "
                        "point run.dir at a run that completed at least one epoch")


def _validate_sync_and_timing(cfg: DictConfig) -> None:
    """A synchroniser that cannot run this config fails here, before any process starts."""
    from .sync import check_sync

    try:
        check_sync(cfg.sync, cfg.launcher.nodes * cfg.launcher.nproc_per_node)
    except ValueError as e:
        raise UserError(str(e)) from None
    for key in ("trace_steps", "tb_every"):
        if cfg.timing[key] < 0:
            raise UserError(f"timing.{key}={cfg.timing[key]}: must be >= 0")


def make_run(cfg: DictConfig, label: str | None = None) -> Path:
    """The run folder, with the resolved config (run.dir set to it) written inside."""
    run_dir = make_run_dir(cfg, label=label)
    with open_dict(cfg):
        cfg.run.dir = str(run_dir)
    write_config(cfg, run_dir)
    return run_dir


def render_and_start(cfg: DictConfig, run_dir: Path) -> int | None:
    """Render the launcher's files into the run folder; with dry_run print them and
    return None, else start the job, follow it and return its exit status."""
    try:
        rendered = launch.render(cfg, run_dir)
    except launch.LaunchError as e:
        raise UserError(str(e)) from None
    rendered.write(run_dir)
    if cfg.launcher.dry_run:
        print(rendered.show.rstrip())
        print(f"run dir: {run_dir}")
        return None
    try:
        return launch.start(rendered, run_dir)
    except launch.LaunchError as e:
        raise UserError(f"{e} (run folder: {run_dir})") from None


def cli(config_name: str, submit_fn: Callable[[DictConfig], int]) -> None:
    """The Hydra entry of `python -m ddp_lab` and `python -m ddp_lab.bench`: compose
    `conf/<config_name>.yaml`, run `submit_fn` per job (one, or each of a -m sweep), and
    exit with the failed job's status (2 for a user mistake, printed as one line)."""
    import sys

    import hydra

    from .config import CONF_DIR

    failed: list[int] = []

    @hydra.main(version_base=None, config_path=str(CONF_DIR), config_name=config_name)
    def _main(cfg: DictConfig) -> None:
        try:
            rc = submit_fn(cfg)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            rc = 2
        if rc != 0:
            failed.append(rc)

    _main()
    sys.exit(failed[0] if len(failed) == 1 else (1 if failed else 0))


def submit(cfg: DictConfig) -> int:
    cfg = resolve_defaults(cfg)
    run_dir = make_run(cfg)
    rc = render_and_start(cfg, run_dir)
    if rc is None:
        return 0
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    if rc != 0 and summary.get("status", "").startswith("completed"):
        summary["status"] = f"failed: job exit status {rc}"
    elif rc != 0 and not summary:
        summary = {"status": f"failed: job exit status {rc} (see {run_dir / 'logs'})"}
    if rc != 0:
        summary.setdefault("launcher", cfg.launcher.name)
        summary.setdefault("sync", cfg.sync.name)
        write_json(summary_path, summary)
        why = summary["status"].removeprefix("failed: ")
        why = "" if why.startswith("job exit status") else f": {why}"
        print(f"job failed with exit status {rc}{why} (logs in {run_dir / 'logs'})")
    elif summary:
        print(f"test accuracy {summary['test_accuracy']:.4f}, "
              f"median epoch {summary['epoch_time_s_median']:.2f} s, "
              f"world size {summary['world_size']} ({summary['backend']}, {summary['device']})")
    print(f"run dir: {run_dir}")
    return rc
