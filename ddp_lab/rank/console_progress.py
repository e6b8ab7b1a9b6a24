"""How an epoch's steps show on the console while they run (log.progress, logging rank only).

- On a terminal (stdout and stderr both one): a tqdm bar on stderr, redrawn in place and
  gone when the epoch's line replaces it.
- Anywhere else (`> file`, `| tee`, a SLURM .out, mpirun's pipes): a bar would be a stream
  of carriage returns, or nothing at all; instead a short line every
  `log.progress_every_s` seconds of the epoch, on the log's console, so a file shows that the
  run lives and how fast it goes:

      [rank 0] step 230/938 of epoch 1/5 (25%), 23.1 steps/s, 31 s left

`log.progress=bar` or `lines` picks one either way; `log.progress_every_s=0` turns the lines
off. Both are tqdm's; the check is made between steps (no thread): a step that takes
longer than the interval delays its line, never skips the count.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Iterable, Optional

from tqdm import tqdm

log = logging.getLogger("ddp_lab")


def on_terminal() -> bool:
    """Whether a person watches this process's output live: a bar needs both streams, the
    lines (stdout, the log's console) and the bar (stderr), on a terminal."""
    try:
        return sys.stdout.isatty() and sys.stderr.isatty()
    except ValueError:  # a stream closed
        return False


def bar_size() -> dict:
    """tqdm's size: the terminal's, followed as it is resized; 100 x 24 where the terminal
    reports none (a pseudo-terminal with no size, as `script` or some IDEs make: tqdm would
    take it as 0 rows and draw nothing)."""
    try:
        if os.get_terminal_size(sys.stderr.fileno()).columns > 0:
            return {"dynamic_ncols": True}
    except OSError:
        pass
    return {"ncols": 100, "nrows": 24}


def duration(seconds: float) -> str:
    if seconds < 100:
        return f"{seconds:.0f} s"
    if seconds < 6000:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class StepLines(tqdm):
    """The steps of `steps` through tqdm, its bar drawn as a line on the console at most
    every `every_s` seconds (tqdm's `mininterval`; the first after `every_s`): steps done
    of the epoch's total, the rate since the epoch began, the time left."""

    monitor_interval = 0  # tqdm's monitor thread only shortens a bar's dynamic interval

    def __init__(self, steps: range, desc: str, every_s: float):
        super().__init__(steps, desc=desc, total=steps.stop, initial=steps.start,
                         mininterval=every_s, delay=every_s, miniters=1, leave=False)

    def display(self, msg: Optional[str] = None, pos: Optional[int] = None) -> bool:
        """tqdm's redraw, as a log line; none on closing (`msg` ''), and none after the
        last step: the epoch's own line comes next."""
        if msg is None and self.n < self.total:
            rate = (self.n - self.initial) / max(self.format_dict["elapsed"], 1e-9)
            log.info("step %d/%d of %s (%.0f%%), %.1f steps/s, %s left", self.n, self.total,
                     self.desc, 100 * self.n / self.total, rate,
                     duration((self.total - self.n) / rate) if rate else "?")
        return False


class StepProgress:
    """What the logging rank wraps each epoch's steps in (see the module's docstring); the
    other ranks get their steps as they are."""

    def __init__(self, mode: str, every_s: float, is_main: bool):
        self.mode, self.every_s, self.is_main = mode, every_s, is_main
        self.bar = is_main and (mode == "bar" or (mode == "auto" and on_terminal()))

    def wrap(self, steps: range, desc: str) -> Iterable[int]:
        """`steps`, the epoch's remaining steps (range(first_step, steps_per_epoch))."""
        if not self.is_main:
            return steps
        if self.bar:
            return tqdm(steps, desc=desc, leave=False, unit="step", **bar_size())
        if self.every_s > 0:
            return StepLines(steps, desc, self.every_s)
        return steps
