"""Before the first step: the synchroniser's preflight (a
misconfiguration fails here, not mid-step), the CPU thread count
(`tune_threads`) and `train.compile`, outside every epoch.
"""

from __future__ import annotations

import copy
import logging
import time
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from ..world import cpu
from ..config import TrainConfig
from ..timing import Clock, StepTimer

log = logging.getLogger("ddp_lab")


def preflight_and_compile(train: TrainConfig, syncer, optimizer: torch.optim.Optimizer,
                          splits: Any, batch_size: int, ctx,
                          steps: Callable) -> Optional[float]:
    """Collective. Preflight, thread count (timing `steps`, the loop's
    run_steps), then train.compile: its seconds, or None."""
    x0, y0 = splits.test_x[:2], splits.test_y[:2]
    syncer.preflight(lambda m=syncer.module: F.cross_entropy(m(x0), y0))
    tune_threads(ctx, syncer, optimizer, splits, batch_size, steps)
    return compile_model(syncer, splits, batch_size) if train.compile else None


def tune_threads(ctx, syncer, optimizer: torch.optim.Optimizer, splits: Any,
                 batch_size: int, run_steps: Callable, blocks: int = 3,
                 steps: int = 8) -> None:
    """Collective. On CPU, where the count was not asked for: time steps
    on 1 thread against the ceiling in alternating blocks, summed over
    the ranks, and keep the ceiling only if 5% faster. State, RNG and
    comm records are left as before."""
    share = cpu.chosen
    if share is None or not share.tunable or share.threads == 1 or ctx.device.type != "cpu":
        return
    n = min(batch_size, len(splits.test_x))
    batch = (splits.test_x[:n], splits.test_y[:n])
    saved = copy.deepcopy((syncer.module.state_dict(), optimizer.state_dict()))
    timer = StepTimer(Clock(ctx.device), enabled=False)
    best = {share.threads: float("inf"), 1: float("inf")}
    with torch.random.fork_rng(devices=[]):
        for _ in range(blocks):
            for threads in best:
                torch.set_num_threads(threads)
                # the first of a count: untimed
                run_steps(syncer, optimizer, [batch], timer)
                t0 = time.perf_counter()
                run_steps(syncer, optimizer, [batch] * steps, timer)
                best[threads] = min(best[threads], (time.perf_counter() - t0) / steps)
    syncer.module.load_state_dict(saved[0])
    optimizer.load_state_dict(saved[1])
    syncer.module.zero_grad(set_to_none=True)
    # the trial steps' collectives are no epoch's
    syncer.collect_comm()
    # every rank's, summed
    many, one = ctx.reduce_floats([best[share.threads], best[1]])
    keep = share.threads if many < 0.95 * one else 1
    torch.set_num_threads(keep)
    cpu.chosen = cpu.RankThreads(keep, f"{share.why}; a training step took {best[1] * 1e3:.2f} "
                                 f"ms on 1 thread, {best[share.threads] * 1e3:.2f} ms on "
                                 f"{share.threads}", False)


def compile_model(syncer, splits: Any, batch_size: int) -> float:
    """train.compile: torch.compile the model the step calls and compile
    it now, at the batch size and at another (the short last batch), so
    no epoch holds the compilation. Weights, optimiser and RNG are
    untouched. Returns the seconds."""
    t0 = time.perf_counter()
    syncer.wrapped = torch.compile(syncer.wrapped)
    n = min(batch_size, len(splits.test_x))
    sizes = [n, n - 1] if n > 2 else [n]
    devices = [syncer.device] if syncer.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        for size in sizes:
            F.cross_entropy(syncer.wrapped(splits.test_x[:size]), splits.test_y[:size]).backward()
            # sync.overlap: the buckets backward started are waited for
            syncer.sync()
    syncer.module.zero_grad(set_to_none=True)
    # DDP's warm-up all-reduces are no epoch's
    syncer.collect_comm()
    if syncer.device.type == "cuda":
        torch.cuda.synchronize(syncer.device)
    seconds = time.perf_counter() - t0
    log.info("train.compile: model compiled in %.1f s (outside every epoch)", seconds)
    return seconds
