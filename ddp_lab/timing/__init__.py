"""Phase timers and communication accounting (docs/timing.md), one file
per idea:

    clock.py          Clock: the rank's time base (host clock on CPU, CUDA events on GPU)
    phases.py         StepTimer, StepTimes, GradReadyMark (compute end), StepWatch
    comm.py           CommStats: what was communicated, in flight and exposed
    comm_recorder.py  CommRecorder: every collective call's bytes and stamps
    summary.py        an epoch's numbers: per-phase statistics, comm share of step time
    stragglers.py     who makes the others wait (StragglerTally)

Timing knows nothing of the rest of the trainer. Every name below is
importable from here.
"""

from .clock import Clock
from .comm import CommCall, CommStats, union_length
from .comm_recorder import CommRecorder
from .phases import PHASES, GradReadyMark, StepTimer, StepTimes, StepWatch
from .stragglers import (STRAGGLER_CHANCE_FACTOR, STRAGGLER_MIN_LATE_S, STRAGGLER_MIN_SHARE, STRAGGLER_MIN_STEPS, StragglerTally, stragglers)
from .summary import describe, epoch_timing, percentile, summarise_steps

__all__ = [
    "PHASES", "STRAGGLER_CHANCE_FACTOR", "STRAGGLER_MIN_LATE_S", "STRAGGLER_MIN_SHARE",
    "STRAGGLER_MIN_STEPS", "Clock", "CommCall", "CommRecorder", "CommStats", "GradReadyMark",
    "StepTimer", "StepTimes", "StepWatch", "StragglerTally", "describe", "epoch_timing", "percentile",
    "stragglers", "summarise_steps", "union_length",
]
