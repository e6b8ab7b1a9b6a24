"""Phase timers and communication accounting.

One `Clock` per rank gives every timestamp of a run: `StepTimer` stamps the phases of
every step (data, forward, backward, sync, optim) and the synchroniser's `CommRecorder`
stamps every collective call. Both resolve their stamps once per epoch, on the same
time base, so a collective can be placed inside its step and phase.

One file per idea:

    clock.py          Clock: the rank's time base (host clock on CPU, CUDA events on GPU)
    steps.py          StepTimer and StepTimes: the phases of every step; GradReadyMark:
                      compute end, the step's last gradient ready; StepWatch: every
                      N-th step handed over while the epoch runs
    comm.py           CommStats: what was communicated, comm_fraction, exposed vs in-flight
    comm_recorder.py  CommRecorder: every collective call's bytes and stamps
    summary.py        an epoch's numbers: per-phase statistics, comm share of step time
    stragglers.py     who makes the others wait (StragglerTally)

Timing knows nothing of the rest of the trainer: the timer and the recorder keep where
the rank is as plain attributes (the phase running, the steps ended, the calls entered),
which the rank's progress record reads (ddp_lab/folder/progress.py). Every name below is
importable from `ddp_lab.timing`.
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
