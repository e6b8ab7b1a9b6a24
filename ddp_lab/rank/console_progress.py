"""How an epoch's steps show on the console (log.progress, logging rank
only): on a terminal a tqdm bar on stderr; anywhere else (a file, a
pipe, a SLURM .out) a line every `log.progress_every_s` seconds, checked
between steps:

      [rank 0] step 230/938 of epoch 1/5 (25%), 23.1 steps/s, 31 s left
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Iterable, Optional

from tqdm import tqdm

log = logging.getLogger("ddp_lab")


def on_terminal() -> bool:
    """Whether stdout (the log's lines) and stderr (the bar) are both a
    terminal."""
    try:
        return sys.stdout.isatty() and sys.stderr.isatty()
    except ValueError:  # a stream closed
        return False


def bar_size() -> dict:
    """tqdm's size: the terminal's, followed; 100 x 24 where it reports
    none (tqdm would take a sizeless pseudo-terminal as 0 rows and draw
    nothing)."""
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
    """tqdm drawing its bar as a log line at most every `every_s`
    seconds: steps done, the rate since the epoch began, the time
    left."""

    # tqdm's monitor thread only shortens a bar's dynamic interval
    monitor_interval = 0

    def __init__(self, steps: range, desc: str, every_s: float):
        super().__init__(steps, desc=desc, total=steps.stop, initial=steps.start,
                         mininterval=every_s, delay=every_s, miniters=1, leave=False)

    def display(self, msg: Optional[str] = None, pos: Optional[int] = None) -> bool:
        """tqdm's redraw as a log line; none on closing, none after the
        last step."""
        if msg is None and self.n < self.total:
            rate = (self.n - self.initial) / max(self.format_dict["elapsed"], 1e-9)
            log.info("step %d/%d of %s (%.0f%%), %.1f steps/s, %s left", self.n, self.total,
                     self.desc, 100 * self.n / self.total, rate,
                     duration((self.total - self.n) / rate) if rate else "?")
        return False


class StepProgress:
    """What the logging rank wraps each epoch's steps in; the others get
    them as they are."""

    def __init__(self, mode: str, every_s: float, is_main: bool):
        self.mode, self.every_s, self.is_main = mode, every_s, is_main
        self.bar = is_main and (mode == "bar" or (mode == "auto" and on_terminal()))

    def wrap(self, steps: range, desc: str) -> Iterable[int]:
        """`steps`, the epoch's remaining steps (range(first_step,
        steps_per_epoch))."""
        if not self.is_main:
            return steps
        if self.bar:
            return tqdm(steps, desc=desc, leave=False, unit="step", **bar_size())
        if self.every_s > 0:
            return StepLines(steps, desc, self.every_s)
        return steps
