"""The epochs and the stop, on every rank: train()'s epochs part (ddp_lab/train.py). `EpochControl`
starts and ends each epoch and hands out its batches as an `EpochBatches` (the step count, the stop
agreement, the injected delays); `end` and `between` return the stop every rank agreed on.

The stop: a request reaches any one process (SIGTERM, SIGINT, `train.stop_signal`, the file
`RUN_DIR/STOP` of ddp_lab/folder/rundir.py, the parent's death); the handlers only set a flag. Ranks
agree with one all-reduce (MAX of [stop code, seconds since the last check]) every `every` steps,
adapted so that checks come about `train.stop_check_s` apart. Codes (higher wins): 1 preempted
(continue later), 2 stopped (a person); a second SIGINT kills at once (docs/failures.md, "The
pieces" and "What the stop check costs").

Injected faults: a crash after an epoch (`DDP_LAB_FAIL_ONCE`, `fail_once`) and compute delays
(`debug.slow_rank` + `debug.slow_ms`, `debug.jitter_ms`): a straggler made on purpose, which the
records must find from what they measure (docs/timing.md, "Stragglers, injected and found"). The
delay is a host sleep at the start of the forward phase, once per step; the jitter comes from the
rank's own `random.Random`, so the training RNG does not move.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

from ..config import Config, DebugConfig
from ..folder.rundir import PREEMPTED, STATUS, STOPPED, clear_stop_file, read_stop_file
from ..timing import Clock, StepTimer
from ..world.distributed import DistContext
from ..world.env import set_parent_death_signal
from .records import MeasuredEpoch, Position, Records

log = logging.getLogger("ddp_lab")

# the most steps between two stop checks
MAX_EVERY = 100_000


@dataclass(frozen=True)
class StopInfo:
    status: str  # preempted | stopped
    reason: str  # what asked for it, e.g. "SIGUSR2 on rank 1"


def die_with_parent() -> None:
    """The first thing a rank does: get SIGTERM when its parent (torchrun, srun, mpirun) dies; a
    parent gone before that, SIGTERM now."""
    parent = os.getppid()
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


#: the signals this process was stopped by: a forked rank that torchrun signalled (closing its
#: ranks, it will not collect a result) leaves at once (rank/main.py)
RECEIVED: set[int] = set()


class StopControl:
    """This rank's side of the agreement; see the module docstring."""

    def __init__(self, ctx, run_dir: Path, user_signal: str = "SIGUSR2", check_s: float = 1.0):
        self.ctx, self.run_dir, self.check_s = ctx, Path(run_dir), max(check_s, 1e-3)
        self.every, self._count = 1, 0
        self._last = time.monotonic()
        self._code, self._reason = 0, ""
        self.checks = 0
        # its death signal is set (die_with_parent): a parent noticed gone is one the signal missed
        self.ppid = os.getppid()
        wanted = {signal.SIGTERM: PREEMPTED, signal.SIGINT: STOPPED}
        if user_signal:
            wanted[getattr(signal, user_signal)] = PREEMPTED
        # each signal's code and the handler it had
        self._signals = {sig: (code, signal.signal(sig, self._on_signal))
                         for sig, code in wanted.items()}

    def restore(self) -> None:
        self.ctx.watchdog.cancel()
        for sig, (_, previous) in self._signals.items():
            signal.signal(sig, previous)
        self._signals.clear()

    def _on_signal(self, signum, frame) -> None:
        RECEIVED.add(signum)
        name = signal.Signals(signum).name
        code = self._signals[signum][0]
        # Ctrl-C again: force. Only SIGINT: SIGTERM may come twice by design (slurmstepd signals
        # every process of the step, and torchrun passes its own on)
        if signum == signal.SIGINT and self._reason.startswith(name):
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self._flag(code, f"{name} on rank {self.ctx.env.rank}")

    def _flag(self, code: int, reason: str) -> None:
        if code > self._code:
            self._code, self._reason = code, reason
            log.warning("stop requested (%s): stopping at the next check", reason)

    def local(self) -> tuple[int, str]:
        if os.getppid() != self.ppid:
            self._flag(STOPPED, "parent process gone (launcher killed)")
        if self.ctx.env.rank == 0:
            found = read_stop_file(self.run_dir)
            if found:
                self._flag(*found)
        return self._code, self._reason

    def restart_clock(self) -> None:
        """Time between checks excludes evaluation and checkpoints (epoch ends)."""
        self._last, self._count = time.monotonic(), 0
        self.ctx.watchdog.rearm()

    def step(self) -> Optional[StopInfo]:
        """After every step: agree now and then whether to stop; the StopInfo when all stop."""
        self._count += 1
        return self.check() if self._count >= self.every else None

    def check(self) -> Optional[StopInfo]:
        """Collective: every rank calls it at the same step."""
        now = time.monotonic()
        self.ctx.watchdog.rearm()  # no stack dump while checks keep coming
        code, _ = self.local()
        agreed, longest = self.ctx.reduce_floats([float(code), now - self._last], "max")
        self.checks += 1
        # adapt: next check about check_s away, growing at most 2x a time
        if self._count:
            per_step = max(longest / self._count, 1e-9)
            self.every = int(min(max(1, self.check_s / per_step), 2 * self.every, MAX_EVERY))
        self._last, self._count = now, 0
        if agreed < 1:
            return None
        reasons = [r for r in self.ctx.gather_objects(self._reason) if r]
        info = StopInfo(STATUS[int(agreed)], "; ".join(dict.fromkeys(reasons)) or "stop")
        log.warning("all ranks stop: %s (%s)", info.status, info.reason)
        return info


class ComputeDelay:
    """Callable: sleep this rank's delay for one step."""

    def __init__(self, fixed_ms: float, jitter_ms: float, seed: int, rank: int):
        self.fixed_s, self.jitter_s = fixed_ms / 1e3, jitter_ms / 1e3
        # its own generator (not `random`'s global one, which checkpoints carry): seeded per rank,
        # so the ranks' jitters are independent and a run repeats its delays
        self.rng = random.Random(f"ddp_lab.rank.delay:{seed}:{rank}")

    def __call__(self) -> None:
        s = self.fixed_s + (self.rng.uniform(0.0, self.jitter_s) if self.jitter_s else 0.0)
        if s > 0:
            time.sleep(s)

    @classmethod
    def from_config(cls, debug: DebugConfig, rank: int, seed: int) -> Optional["ComputeDelay"]:
        """This rank's delay per `debug` (the config's debug section); None when none."""
        fixed = debug.slow_ms if debug.slow_rank == rank else 0.0
        if fixed <= 0 and debug.jitter_ms <= 0:
            return None
        return cls(fixed, debug.jitter_ms, seed, rank)


def fail_once(ctx: DistContext, epoch: int) -> None:
    """Fault injection for testing restarts: DDP_LAB_FAIL_ONCE="rank=R,epoch=E" kills rank R after
    epoch E, on the first attempt only (TORCHELASTIC_RESTART_COUNT == 0)."""
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
    # load-bearing: rank 0 has written this epoch's checkpoint before anyone dies
    ctx.barrier()
    if ctx.env.rank == rank:
        log.error("DDP_LAB_FAIL_ONCE: rank %d exits after epoch %d (first attempt only)", rank, epoch)
        logging.shutdown()
        # a crash, not an exception: no clean-up, as a killed process
        os._exit(17)


class EpochBatches:
    """`for x, y in batches:` each step's batch, its data phase timed, then the injected delay;
    after each step, ends if every rank agreed to stop (`stop` says why)."""

    def __init__(self, data: Iterator, numbers: Iterable, timer: StepTimer,
                 stopper: Optional[StopControl] = None, delay: Optional[Callable[[], None]] = None,
                 first_step: int = 0):
        self.data, self.numbers, self.timer = data, numbers, timer
        self.stopper, self.delay, self.first_step = stopper, delay, first_step
        self.done, self.samples = 0, 0  # steps and samples this rank ran in this part
        self.stop: Optional[StopInfo] = None

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in self.numbers:
            with self.timer.phase("data"):
                x, y = next(self.data)
            if self.delay is not None:
                # an injected straggler: part of this rank's compute
                with self.timer.phase("forward"):
                    self.delay()
            yield x, y  # the step runs here
            self.done, self.samples = self.done + 1, self.samples + len(y)
            if self.stopper is not None:
                self.stop = self.stopper.step()  # collective now and then: all stop alike
                if self.stop is not None:
                    return


class EpochControl(contextlib.AbstractContextManager):
    """train()'s epochs part; see the module docstring. `with control:` restores the signal
    handlers on leaving."""

    def __init__(self, cfg: Config, ctx: DistContext, run_dir: Path, records: Records):
        self.train, self.debug, self.ctx, self.run_dir = cfg.train, cfg.debug, ctx, run_dir
        self.records = records
        self.stopper: Optional[StopControl] = None
        self.epoch, self.t0 = 0, 0.0

    def __exit__(self, *exc: Any) -> None:
        if self.stopper is not None:
            self.stopper.restore()

    def start(self, clock: Clock, timer: StepTimer, parts: Any, start: Position) -> None:
        """Collective. The run starts at `start`: the ranks listen for stops from here."""
        ctx, syncer = self.ctx, parts.syncer
        self.clock, self.timer, self.syncer, self.resumed = clock, timer, syncer, start
        if ctx.heartbeat is not None:
            ctx.heartbeat.follow(timer=timer)  # its phases: where this rank is (status)
        # compute end (each step's last gradient ready), where exposed comm starts; not on one rank
        if ctx.env.world_size > 1:
            timer.watch_grads(syncer.module)
        self.delay = ComputeDelay.from_config(self.debug, ctx.env.rank, self.train.seed)
        self.stopper = StopControl(ctx, self.run_dir, self.train.stop_signal,
                                   self.train.stop_check_s)
        if ctx.env.is_main:
            clear_stop_file(self.run_dir)  # a request the previous allocation acted on is spent
        # load-bearing: no rank checks for a stop before the old request is gone
        ctx.barrier()

    def resumed_part(self, epoch: int) -> Position:
        """The part of `epoch` (0-based) the resumed checkpoint holds, as this rank adds it: loss
        and sample sums on rank 0 only (counted once), times on every rank."""
        s = self.resumed
        if epoch != s.epoch or not s.step:
            return Position()
        return s if self.ctx.env.is_main else Position(s.epoch, s.step, 0.0, 0, s.busy_s, s.wall_s, 0)

    def batches(self, epoch: int, shard: Any) -> EpochBatches:
        """Collective. Epoch `epoch` (0-based) starts, from a mid-epoch checkpoint's step."""
        skip = self.resumed_part(epoch).step
        shard.set_epoch(epoch)  # this epoch's shuffle, the same on every rank
        self.ctx.synchronize()
        # load-bearing: every rank starts the clock together
        self.ctx.barrier()
        # the GPU is idle here: its timeline is pinned to the host clock
        self.clock.anchor()
        self.stopper.restart_clock()
        if self.ctx.heartbeat is not None:
            self.ctx.heartbeat.at(epoch, skip)
        self.epoch, self.t0 = epoch, time.perf_counter()
        return EpochBatches(shard.iter_from(skip), self.records.step_numbers(epoch, skip), self.timer,
                            self.stopper, self.delay, first_step=skip)

    def end(self, batches: EpochBatches, loss_sum: torch.Tensor,
            correct: torch.Tensor) -> tuple[MeasuredEpoch, Optional[StopInfo]]:
        """Collective. What this rank measured, and the stop agreed on inside the epoch."""
        self.ctx.synchronize()  # the GPU's work of the epoch done
        busy = time.perf_counter() - self.t0  # this rank's own time, before waiting for the others
        # load-bearing: the epoch ends when the slowest rank ends
        self.ctx.barrier()
        wall = time.perf_counter() - self.t0
        # the epoch's stamps and comm, taken before the checkpoint (a synchroniser may communicate
        # to bring the optimiser state to rank 0) adds to them
        times, comm = self.timer.collect(), self.syncer.collect_comm()
        self.records.steps_measured(times, comm)
        measured = MeasuredEpoch(self.epoch + 1, times, comm, busy, wall, loss_sum.item(),
                                 batches.samples, int(correct.item()),
                                 resumed_at_step=batches.first_step,
                                 resumed_part=self.resumed_part(self.epoch))
        return measured, batches.stop

    def between(self, epochs_done: int) -> Optional[StopInfo]:
        """Collective, after an epoch's checkpoint and record: the failure hook, then (not after
        the last epoch) the stop the ranks agreed on."""
        fail_once(self.ctx, epochs_done)
        return self.stopper.check() if epochs_done < self.train.epochs else None
