"""Every check of a command, in one layer, run before any process starts
or any folder is made (`python -m ddp_lab` and `python -m ddp_lab.bench`
both call `resolve`).

A rule is a small function of the composed config that returns None, or
one line naming the key and the fix (or raises a `UserError`); rules sit
in tables, one per entry point: COMMON and TRAIN here, STUDY_PLAN and
STUDY in study_plan.py, BENCH in bench/submit.py. The rules themselves:
config_rules.py, folder_rules.py, machine_rules.py, train_rules.py. The
launcher's own checks run first (`launch.resolve`, which also fills its
derived values).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

from omegaconf import DictConfig, open_dict

from .. import launch
from ..config.errors import UserError
from ..config.student import absolute_spec
from ..world.devices import default_nproc
from ..config.sync import COMPRESS_MODES
from .lock import in_use
from ..folder.rundir import reuse_problem
from .config_rules import durations, known_sections, required_launcher_keys
from .folder_rules import data_folder, run_folder
from .machine_rules import dist_pair, fused_support, oversubscription, twin_support
from .train_rules import (batch_fits, cuda_graph_fits, debug_delays, model_fits, run_entry,
                          student_code_passes,
                          stop_signal, sync_fits)

Rule = Callable[[DictConfig], Optional[str]]


def _get(cfg: DictConfig, key: str):
    node = cfg
    for part in key.split("."):
        node = node[part]
    return node


def at_least(key: str, low: float, note: str = "") -> Rule:
    return lambda cfg: (None if _get(cfg, key) >= low
                        else f"{key}={_get(cfg, key)}: must be >= {low}{note}")


def above(key: str, low: float) -> Rule:
    return lambda cfg: None if _get(cfg, key) > low else f"{key}={_get(cfg, key)}: must be > {low}"


def one_of(key: str, choices: Sequence[str]) -> Rule:
    return lambda cfg: (None if _get(cfg, key) in choices
                        else f"{key}={_get(cfg, key)}: choose {', '.join(choices[:-1])} or {choices[-1]}")


COMMON: list[Rule] = [
    at_least("launcher.nodes", 1),
    at_least("launcher.nproc_per_node", 1),
    oversubscription,
    one_of("dist.backend", ("auto", "gloo", "nccl")),
    one_of("dist.device", ("auto", "cpu", "cuda")),
    dist_pair,
    above("dist.timeout_s", 0),
    above("dist.init_timeout_s", 0),
    one_of("log.progress", ("auto", "bar", "lines")),
    at_least("log.progress_every_s", 0),
    one_of("log.ranks", ("0", "all")),
    required_launcher_keys,
    durations,
    run_folder,
]


TRAIN: list[Rule] = [
    known_sections,
    at_least("train.epochs", 1),
    at_least("train.batch_size", 1),
    above("train.lr", 0),
    at_least("train.max_steps_per_epoch", 0, " (0 = the whole shard)"),
    at_least("train.eval_batch_size", 1),
    at_least("train.threads", 0, " (0 = decided at start)"),
    *COMMON,
    one_of("data.pipeline", ("tensor", "dataloader")),
    lambda cfg: None if len(cfg.data.mirrors) else
    "data.mirrors is empty: give at least one (default: [embedded])",
    at_least("data.num_workers", 0),
    at_least("timing.trace_steps", 0),
    at_least("timing.tb_every", 0),
    at_least("timing.profile_skip", 0),
    at_least("timing.profile_steps", 1),
    above("train.stop_check_s", 0),
    stop_signal,
    run_entry,
    # another command's job in run.dir: said before what the folder
    # holds
    in_use,
    reuse_problem,
    batch_fits,
    model_fits,
    one_of("sync.compress", COMPRESS_MODES),
    sync_fits,
    student_code_passes,
    cuda_graph_fits,
    fused_support,
    twin_support,
    debug_delays,
    data_folder,
]


def check(cfg: DictConfig, rules: Sequence[Rule]) -> None:
    """Raise the first broken rule's message as a UserError."""
    for rule in rules:
        message = rule(cfg)
        if message:
            raise UserError(message)


def resolve(cfg: DictConfig, rules: Sequence[Rule]) -> DictConfig:
    """A copy of `cfg` with what depends on this machine filled in and
    paths made absolute (ranks may start elsewhere: all must read the
    same folders), checked by `rules`."""
    cfg = cfg.copy()
    with open_dict(cfg):
        # the launcher's own defaults and checks (LaunchError)
        launch.resolve(cfg)
        if cfg.launcher.nproc_per_node is None:
            cfg.launcher.nproc_per_node = default_nproc()
        if "data" in cfg:
            cfg.data.root = str(Path(cfg.data.root).expanduser().resolve())
            cfg.data.mirrors = [m if m == "embedded" or "://" in m
                                else str(Path(m).expanduser().resolve()) for m in cfg.data.mirrors]
        # a student's file (sync=custom): ranks may start in another folder
        if "sync" in cfg and cfg.sync.get("all_reduce"):
            cfg.sync.all_reduce = absolute_spec(cfg.sync.all_reduce)
    check(cfg, rules)
    # last: the command's own mistakes are said first
    launch.check_tool(cfg)
    return cfg


def resolve_train(cfg: DictConfig) -> DictConfig:
    """A training run's config resolved and checked (a study's:
    `study.resolve_study`)."""
    return resolve(cfg, TRAIN)
