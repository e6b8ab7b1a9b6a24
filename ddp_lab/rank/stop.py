"""Graceful stop: every rank agrees to stop at the same step boundary,
then checkpoints.

A stop reaches any one process (SIGTERM, SIGINT, `train.stop_signal`,
the file `RUN_DIR/STOP` of ddp_lab/folder/rundir.py, the parent's death);
the handlers only set a flag. Ranks agree with one all-reduce (MAX of
[stop code, seconds since the last check]) every `every` steps, adapted
so that checks come about `train.stop_check_s` apart. Codes (higher
wins): 1 preempted (continue later), 2 stopped (a person); a second
SIGINT kills at once. docs/failures.md, "The pieces" and "What the stop
check costs".
"""

from __future__ import annotations

import logging
import os
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

from ..config import TrainConfig
from ..world import hang
from ..world.env import set_parent_death_signal
from ..folder.rundir import (PREEMPTED, STATUS, STOPPED, clear_stop_file,
                           read_stop_file)

# rank/main imports this module before torch loads (OMP_WAIT_POLICY
# first)
if TYPE_CHECKING:
    from ..world.distributed import DistContext

log = logging.getLogger("ddp_lab")

MAX_EVERY = 100_000


@dataclass(frozen=True)
class StopInfo:
    status: str  # preempted | stopped
    # what asked for it, e.g. "SIGUSR2 on rank 1"
    reason: str


# the rank's parent (torchrun, srun, mpirun) when it started
_PARENT: Optional[int] = None


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """The first thing a rank does: get `sig` when its parent dies, and
    remember the parent."""
    global _PARENT
    _PARENT = os.getppid()
    return set_parent_death_signal(sig)


#: the signals this process was stopped by: a forked rank that torchrun
#: signalled (torchrun is closing its ranks and will not collect a
#: result) leaves at once (rank/main.py)
RECEIVED: set[int] = set()


class StopControl:
    """This rank's side of the agreement; see the module docstring."""

    def __init__(self, ctx, run_dir: Path, user_signal: str = "SIGUSR2", check_s: float = 1.0,
                 install: bool = True):
        self.ctx, self.run_dir, self.check_s = ctx, Path(run_dir), max(check_s, 1e-3)
        self.every, self._count = 1, 0
        self._last = time.monotonic()
        self._code, self._reason = 0, ""
        self.checks = 0
        # a parent gone before this is noticed too
        self.ppid = _PARENT or os.getppid()
        self._signals: dict[int, tuple[int, object]] = {}
        if install:
            self._install(user_signal)

    # ------------------------------------------------------------ local sources
    def _install(self, user_signal: str) -> None:
        wanted = {signal.SIGTERM: PREEMPTED, signal.SIGINT: STOPPED}
        if user_signal:
            wanted[getattr(signal, user_signal)] = PREEMPTED
        for sig, code in wanted.items():
            self._signals[sig] = (code, signal.signal(sig, self._on_signal))
        # the parent died before the death signal was set
        if os.getppid() != self.ppid:
            self._flag(STOPPED, "parent process gone")

    def restore(self) -> None:
        hang.watchdog().cancel()
        for sig, (_, previous) in self._signals.items():
            signal.signal(sig, previous)
        self._signals.clear()

    def _on_signal(self, signum, frame) -> None:
        RECEIVED.add(signum)
        name = signal.Signals(signum).name
        code = self._signals[signum][0]
        # Ctrl-C again: force. Only SIGINT: SIGTERM may come twice by
        # design (slurmstepd signals every process of the step, and
        # torchrun passes its own on)
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

    # ------------------------------------------------------------ agreement
    def restart_clock(self) -> None:
        """Time between checks excludes evaluation and checkpoints
        (epoch ends)."""
        self._last, self._count = time.monotonic(), 0
        hang.watchdog().rearm()

    def step(self) -> Optional[StopInfo]:
        """After every step: agree now and then whether to stop; the
        StopInfo when all stop."""
        self._count += 1
        if self._count < self.every:
            return None
        return self.check()

    def check(self) -> Optional[StopInfo]:
        """Collective: every rank calls it at the same step."""
        now = time.monotonic()
        # no stack dump while checks keep coming
        hang.watchdog().rearm()
        code, _ = self.local()
        agreed, longest = self.ctx.reduce_floats([float(code), now - self._last], "max")
        self.checks += 1
        # adapt: next check about check_s away, growing at most 2x a
        # time
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


@contextmanager
def stop_control(ctx: DistContext, run_dir: Path,
                 train: TrainConfig) -> Iterator[StopControl]:
    """A run's StopControl per the train section: a stop request the
    previous allocation acted on is spent first; the signal handlers are
    restored on leaving."""
    stopper = StopControl(ctx, run_dir, train.stop_signal, train.stop_check_s)
    try:
        if ctx.env.is_main:
            # a request the previous allocation acted on is spent
            clear_stop_file(run_dir)
        # load-bearing: no rank checks for a stop before the old request
        # is gone
        ctx.barrier()
        yield stopper
    finally:
        stopper.restore()
