"""The scaffold of the training benchmarks of ddp_lab/bench/specs/ that time the trainer's parts
(syncs, overlap, stop, network): ranks of a one-machine gloo group, each with the trainer's parts
built as `ddp_lab.train.train` builds them.

    def worker(ctx, args):                      # on every rank, in its own process
        bench = Bench(ctx, [f"data.root={args.data_root}"])    # config, data, Clock
        parts = bench.parts(bench.compose(["sync=ring"]), epoch=1)
        return bench.epoch(parts, steps=20)     # s, all ranks' start to the slowest's end

    results = run_ranks(worker, 2, args)        # {rank: what worker returned}

`worker` is a module-level function of the spec (the spawned ranks import it by name).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, NamedTuple, Optional, Sequence

import torch

from ..config import Config, compose
from ..data import build_splits
from ..data_fetch import prepare_mnist
from ..world.distributed import DistContext, local_gloo_world
from ..world.ports import free_port
from ..rank.epochs import EpochBatches, StopControl
from ..timing import PHASES, Clock, StepTimer, epoch_timing
from ..step import run_steps
from ..train import build_parts


def run_ranks(body: Callable[[DistContext, Any], Any], world: int, args: Any,
              timeout_s: float = 3600) -> dict[int, Any]:
    """`body(ctx, args)` on `world` spawned ranks of a local gloo group; what each returned, by
    rank. A rank that raised: exits (1) with its error."""
    import torch.multiprocessing as mp

    mpc = mp.get_context("spawn")
    queue = mpc.Queue()
    port = free_port()
    procs = [mpc.Process(target=_rank, args=(r, world, port, body, args, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    for _ in procs:
        rank, ok, out = queue.get(timeout=timeout_s)
        if not ok:
            sys.exit(f"rank {rank} failed: {out}")
        results[rank] = out
    for p in procs:
        p.join()
    return results


def _rank(rank: int, world: int, port: int, body: Callable, args: Any, queue) -> None:
    import torch.distributed as dist

    ctx = local_gloo_world(rank, world, port)
    try:
        queue.put((rank, True, body(ctx, args)))
    except BaseException as e:  # noqa: BLE001 -- reported by the parent
        queue.put((rank, False, f"{type(e).__name__}: {e}"))
        raise
    finally:
        dist.destroy_process_group()


class Parts(NamedTuple):
    """What one measured configuration trains with, fresh: `build_parts`' three and a timer."""
    module: torch.nn.Module
    syncer: Any
    optimizer: torch.optim.Optimizer
    timer: StepTimer


class Bench:
    """One rank's bench: the composed config (`overrides` on the trainer's defaults), this rank's
    MNIST shard and a Clock, set up as `train()` sets them up."""

    def __init__(self, ctx: DistContext, overrides: Sequence[str]):
        self.ctx, self.overrides = ctx, list(overrides)
        self.cfg = compose(self.overrides)
        data = self.cfg.data
        prepare_mnist(data.root, list(data.mirrors), ctx, data.node_local)
        self.splits = build_splits(data, self.cfg.train, ctx.env, ctx.device)
        self.clock = Clock(ctx.device)

    def compose(self, overrides: Sequence[str]) -> Config:
        """The bench's config with one configuration's overrides on top (`sync=ring`, ...)."""
        return compose([*self.overrides, *overrides])

    def steps(self, most: int) -> int:
        """Steps per epoch: the shard's batches, or `most` of them where `most` > 0."""
        n = len(self.splits.train)
        return min(most, n) if most > 0 else n

    def parts(self, cfg: Config, epoch: int, watch_grads: bool = False) -> Parts:
        """`cfg`'s parts as the trainer builds them (the same weights each time) and a step timer
        (compute's end stamped if `watch_grads`); the data in epoch `epoch`'s order."""
        module, syncer, optimizer = build_parts(cfg, self.ctx, self.clock)
        timer = StepTimer(self.clock, enabled=cfg.timing.enabled)
        if watch_grads:
            timer.watch_grads(module)
        self.splits.train.set_epoch(epoch)
        return Parts(module, syncer, optimizer, timer)

    def epoch(self, parts: Parts, steps: int, stopper: Optional[StopControl] = None) -> float:
        """`steps` of the trainer's step loop between two barriers, then the synchroniser closed:
        seconds from when every rank starts to when the slowest ends."""
        # load-bearing: all ranks start together
        self.ctx.barrier()
        if stopper is not None:
            # as the trainer does at each epoch's start
            stopper.restart_clock()
        t0 = time.perf_counter()
        batches = EpochBatches(iter(self.splits.train), range(steps), parts.timer, stopper)
        run_steps(parts.syncer, parts.optimizer, batches, parts.timer)
        # load-bearing: the epoch ends when the slowest rank ends
        self.ctx.barrier()
        wall = time.perf_counter() - t0
        parts.syncer.close()
        return wall

    def split_epoch(self, cfg: Config, epoch: int, steps: int) -> tuple:
        """One epoch of `cfg` with compute's end stamped (as trained): ms per step of the step, its
        compute, its exposed and in-flight comm; and the epoch's step times and comm."""
        parts = self.parts(cfg, epoch, watch_grads=True)
        wall = self.epoch(parts, steps)
        st, comm = parts.timer.collect(), parts.syncer.collect_comm()
        parts.timer.grads.remove()
        t = epoch_timing(st, comm)
        ms = {"step_ms": wall, "compute_ms": t["compute_s"],
              "exposed_ms": t["exposed_s"], "inflight_ms": comm.seconds}
        ms = {k: 1e3 * v / steps for k, v in ms.items()}
        return ms, st, comm


def stamped_step(timer, comm, work: Callable[[], None] = lambda: None,
                 nbytes: int = 8) -> None:
    """One step of the trainer's stamps alone: its five phases timed, `work()` in each, and in sync
    one timed all_reduce of `nbytes`."""
    for p in PHASES:
        with timer.phase(p):
            if p != "sync":
                work()
                continue
            with comm.timed("all_reduce", nbytes, nbytes, nbytes):
                work()
    timer.end_step()
