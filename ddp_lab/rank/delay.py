"""Injected faults: a crash after an epoch (`DDP_LAB_FAIL_ONCE`,
`fail_once`) and compute delays (`debug.slow_rank` + `debug.slow_ms`,
`debug.jitter_ms`): a straggler made on purpose, which telemetry must
find from what it measures (docs/timing.md, "Stragglers, injected and
found"). The delay is a host sleep at the start of the forward phase,
once per step (compute, and on CUDA a late launch); the jitter comes
from the rank's own `random.Random`, so the training RNG does not move.
"""

from __future__ import annotations

import logging
import os
import random
import time
from typing import TYPE_CHECKING, Optional

# types only: the delays and the fault need no torch
if TYPE_CHECKING:
    from ..config import DebugConfig
    from ..world.distributed import DistContext

log = logging.getLogger("ddp_lab")


class ComputeDelay:
    """Callable: sleep this rank's delay for one step."""

    def __init__(self, fixed_ms: float, jitter_ms: float, seed: int, rank: int):
        self.fixed_s, self.jitter_s = fixed_ms / 1e3, jitter_ms / 1e3
        # its own generator (not `random`'s global one, which
        # checkpoints carry): seeded per rank, so the ranks' jitters are
        # independent and a run repeats its delays
        self.rng = random.Random(f"ddp_lab.rank.delay:{seed}:{rank}")

    def __call__(self) -> None:
        s = self.fixed_s + (self.rng.uniform(0.0, self.jitter_s) if self.jitter_s else 0.0)
        if s > 0:
            time.sleep(s)

    @classmethod
    def from_config(cls, debug: DebugConfig, rank: int, seed: int) -> Optional["ComputeDelay"]:
        """This rank's delay per `debug` (the config's debug section);
        None when none."""
        fixed = debug.slow_ms if debug.slow_rank == rank else 0.0
        if fixed <= 0 and debug.jitter_ms <= 0:
            return None
        return cls(fixed, debug.jitter_ms, seed, rank)


def injected(debug: Optional[DebugConfig]) -> Optional[dict]:
    """What summary.json records of the injection (None when nothing is
    injected, or no debug section is given)."""
    if debug is None:
        return None
    slow = debug.slow_rank >= 0 and debug.slow_ms > 0
    if not slow and debug.jitter_ms <= 0:
        return None
    return {"slow_rank": debug.slow_rank if slow else None,
            "slow_ms": float(debug.slow_ms) if slow else 0.0,
            "jitter_ms": float(debug.jitter_ms)}


def fail_once(ctx: DistContext, epoch: int) -> None:
    """Fault injection for testing restarts:
    DDP_LAB_FAIL_ONCE="rank=R,epoch=E" kills rank R after epoch E, on
    the first attempt only (TORCHELASTIC_RESTART_COUNT == 0)."""
    spec = os.environ.get("DDP_LAB_FAIL_ONCE")
    if not spec or ctx.env.restart_count > 0:
        return
    try:
        want = {k.strip(): int(v) for k, v in (kv.split("=") for kv in spec.split(","))}
        rank, at = want["rank"], want["epoch"]
    except (ValueError, KeyError):
        raise ValueError(f"DDP_LAB_FAIL_ONCE={spec!r}: expected 'rank=R,epoch=E'") from None
    if epoch != at:
        return
    # load-bearing: rank 0 has written this epoch's checkpoint before
    # anyone dies
    ctx.barrier()
    if ctx.env.rank == rank:
        log.error("DDP_LAB_FAIL_ONCE: rank %d exits after epoch %d (first attempt only)", rank, epoch)
        logging.shutdown()
        # a crash, not an exception: no clean-up, as a killed process
        os._exit(17)
