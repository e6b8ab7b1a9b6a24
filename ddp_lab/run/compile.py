"""Before the first step: the synchroniser's preflight (a misconfiguration fails here, on
every rank, not mid-step) and `train.compile` (torch.compile, compiled outside every epoch
so that no epoch's time holds the compilation)."""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch
import torch.nn.functional as F

from ..config import TrainConfig
from ..data import Splits

log = logging.getLogger("ddp_lab")


def preflight_and_compile(train: TrainConfig, syncer, splits: Splits, batch_size: int) -> Optional[float]:
    """The synchroniser's preflight on two test samples (a misconfiguration fails here, not
    mid-step), then train.compile's compilation: its seconds, None when not compiled."""
    x0, y0 = splits.test_x[:2], splits.test_y[:2]
    syncer.preflight(lambda m=syncer.module: F.cross_entropy(m(x0), y0))
    return compile_model(syncer, splits, batch_size) if train.compile else None


def compile_model(syncer, splits: Splits, batch_size: int) -> float:
    """train.compile: torch.compile the model the step calls (DDP's wrapper included: dynamo
    splits its graph at DDP's buckets) and compile it now, so that no epoch holds the
    compilation: one forward and backward at the batch size, then one at another size (the
    epoch's short last batch would otherwise compile a dynamic-shape graph mid-epoch).
    Gradients are dropped; weights, optimiser and RNG are untouched. Returns the seconds."""
    t0 = time.perf_counter()
    syncer.model = torch.compile(syncer.model)
    n = min(batch_size, len(splits.test_x))
    sizes = [n, n - 1] if n > 2 else [n]
    devices = [syncer.device] if syncer.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        for size in sizes:
            F.cross_entropy(syncer.model(splits.test_x[:size]), splits.test_y[:size]).backward()
            syncer.sync()  # sync.overlap: the buckets backward started are waited for
    syncer.module.zero_grad(set_to_none=True)
    syncer.collect_comm()  # DDP's warm-up all-reduces are no epoch's
    if syncer.device.type == "cuda":
        torch.cuda.synchronize(syncer.device)
    seconds = time.perf_counter() - t0
    log.info("train.compile: model compiled in %.1f s (outside every epoch)", seconds)
    return seconds
