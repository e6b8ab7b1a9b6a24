"""The rules of a training run: its sync, batch, model, CUDA graph,
delays, stop signal and entry module fit this config and world."""

from __future__ import annotations

import importlib.util
import signal
from typing import Optional

from omegaconf import DictConfig

from ..config import batch_plan, check_model, check_sync, cuda_graph_problem, device_type
from ..config.run import debug_problem
from ..world.devices import local_gpus
from ..folder.rundir import world_size


def sync_fits(cfg: DictConfig) -> Optional[str]:
    """A synchroniser that cannot run this config (or world size) fails
    here."""
    try:
        check_sync(cfg.sync, world_size(cfg))
    except ValueError as e:
        # the synchronisers' check() speaks ValueError, with the fix
        return str(e)
    return None


def student_code_passes(cfg: DictConfig) -> Optional[str]:
    """sync=custom: the student's all-reduce passes its check at this
    world size before any rank starts (a dry run starts none: not
    checked)."""
    if cfg.sync.name != "custom" or cfg.launcher.get("dry_run"):
        return None
    from .student_check import refusal

    return refusal(cfg.sync.all_reduce, "all_reduce", world_size(cfg) or 1, "sync.all_reduce")


def batch_fits(cfg: DictConfig) -> Optional[str]:
    """train.global_batch and train.micro_batch: >= 0, and splitting
    evenly over this world (the rule lives in config.batch_plan, which
    every rank applies again)."""
    try:
        batch_plan(cfg.train, world_size(cfg))
    except ValueError as e:
        return str(e)
    return None


def model_fits(cfg: DictConfig) -> Optional[str]:
    """The model's sizes (mlp widths, cnn channels): its schema's check
    (config/workload.py)."""
    try:
        check_model(cfg.model)
    except ValueError as e:
        return str(e)
    return None


def cuda_graph_fits(cfg: DictConfig) -> Optional[str]:
    """train.cuda_graph=true: what a graph cannot hold (config/train.py
    cuda_graph_problem). On a local launch that starts, dist.device=auto
    is what it will be on this machine."""
    device = cfg.dist.device
    if device == "auto" and cfg.launcher.name == "local" and not cfg.launcher.dry_run:
        device = device_type(device, local_gpus() > 0)
    try:
        accumulation = batch_plan(cfg.train, world_size(cfg) or 1).accumulation
    except ValueError:
        # a batch that cannot split: batch_fits says so
        accumulation = 1
    return cuda_graph_problem(cfg, device, accumulation)


def debug_delays(cfg: DictConfig) -> Optional[str]:
    """debug.slow_rank names a rank of this world; delays are >= 0
    (config/run.py)."""
    return debug_problem(cfg.debug, world_size(cfg))


def stop_signal(cfg: DictConfig) -> Optional[str]:
    name = cfg.train.stop_signal
    if name and not (name.startswith("SIG") and isinstance(getattr(signal, name, None), signal.Signals)):
        return f"train.stop_signal={name}: not a signal name (e.g. SIGUSR2, SIGTERM; '' = none)"
    if name in ("SIGKILL", "SIGSTOP", "SIGUSR1"):
        return (f"train.stop_signal={name}: cannot be caught" if name != "SIGUSR1" else
                "train.stop_signal=SIGUSR1: NCCL uses it; pick SIGUSR2 (the default)")
    return None


ONE_FILE_SYNCS = ("naive", "ring")


def run_entry(cfg: DictConfig) -> Optional[str]:
    """run.entry is a module this Python finds: a typo is one line here,
    not a traceback from every rank."""
    entry = cfg.run.entry
    # the lesson itself takes flags, never a run folder
    if entry == "ddp_lab.one_file":
        return ("run.entry=ddp_lab.one_file: the lesson takes flags, not a "
                "run folder; use run.entry=ddp_lab.rank.one_file, which "
                "runs it with this run's settings")
    # the lesson's syncs (one_file.SYNCS; the lesson loads torch)
    if entry == "ddp_lab.rank.one_file" and cfg.sync.name not in ONE_FILE_SYNCS:
        return (f"sync={cfg.sync.name}: run.entry=ddp_lab.rank.one_file "
                "runs stop 0, which has sync=naive and sync=ring")
    try:
        if importlib.util.find_spec(entry) is not None:
            return None
    except (ImportError, ValueError):
        pass
    return (f"run.entry={entry}: no such module; give one every rank runs as `python -m "
            "MODULE RUN_DIR` (default ddp_lab.worker; the one-file lesson: ddp_lab.rank.one_file)")
