"""Steps read while the epoch runs: `StepWatch` hands every `every`-th step (the global
steps whose number is a multiple of `every`) to a listener as soon as its stamps can be
read, so TensorBoard shows the steps while training goes on (ddp_lab/rank/telemetry.py).

    watch = StepWatch(timer, comm, every, on_step)   # on_step(number, StepTimes, calls)
    watch.begin(steps_done)                          # at each epoch's start

It listens to the timer's step ends (after the listener the timer had), so a step is
handed over as it ends, the last before a stop included. It never waits for the device:
on CPU a step is handed over at once; on CUDA its stamps are events that fire when the GPU
gets there, so it is handed over at the first step end after they fired (usually a step
or two later). A step's calls are those recorded between its start and its end. The
epoch's end still reads every stamp (`StepTimer.collect`): what the watch had not handed
over yet is written from there.
"""

from __future__ import annotations

from typing import Callable

from .comm import CommCall
from .comm_recorder import CommRecorder
from .steps import StepTimer, StepTimes


class StepWatch:
    """Every `every`-th step of `timer` and its calls on `comm`, handed to `on_step`."""

    def __init__(self, timer: StepTimer, comm: CommRecorder, every: int,
                 on_step: Callable[[int, StepTimes, list[CommCall]], None]):
        self.timer, self.comm, self.every, self.on_step = timer, comm, every, on_step
        self.done = self.index = self.first = 0
        self.waiting: list[tuple[int, int, int, int]] = []  # (number, index, first, end call)
        heard = timer.on_step_end  # the timer calls one listener: this one calls both

        def step_ended() -> None:
            if heard is not None:
                heard()
            self._step_ended()

        timer.on_step_end = step_ended

    def begin(self, done: int) -> None:
        """An epoch (or its resumed part) starts, `done` global steps before its first:
        the timer's and the recorder's lists start anew (collected at the last end)."""
        self.done, self.index, self.waiting = done, 0, []
        self.first = self.comm.count()

    def _step_ended(self) -> None:
        self.done += 1
        end = self.comm.count()
        if self.done % self.every == 0:
            self.waiting.append((self.done, self.index, self.first, end))
        self.index, self.first = self.index + 1, end
        while self.waiting and self._hand_over(*self.waiting[0]):
            self.waiting.pop(0)

    def _hand_over(self, number: int, i: int, first: int, end: int) -> bool:
        """Step `number` to the listener if its stamps can be read now."""
        times = self.timer.ready(i)
        calls = None if times is None else self.comm.ready(first, end)
        if calls is None:
            return False
        self.on_step(number, times, calls)
        return True
