"""Phase timers and communication accounting (docs/timing.md), one file per idea:

    clock.py          Clock: the rank's time base (host clock on CPU, CUDA events on GPU)
    phases.py         StepTimer, StepTimes, GradReadyMark (compute end), StepWatch
    comm.py           CommRecorder: every collective call's bytes and stamps;
                      CommStats: what was communicated, in flight and exposed
    summary.py        an epoch's numbers: per-phase statistics, comm share of step time,
                      who makes the others wait (StragglerTally)

Timing knows nothing of the rest of the trainer. Every name below is importable from here.
"""

from .clock import Clock
from .comm import CommCall, CommRecorder, CommStats, union_length
from .phases import PHASES, GradReadyMark, StepTimer, StepTimes, StepWatch
from .summary import (STRAGGLER_CHANCE_FACTOR, STRAGGLER_MIN_LATE_S, STRAGGLER_MIN_SHARE,
                      STRAGGLER_MIN_STEPS, StragglerTally, describe, epoch_timing, percentile,
                      stragglers, summarise_steps)

