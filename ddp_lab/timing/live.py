"""Steps read while the epoch runs: `StepWatch` hands every `every`-th step (the global
steps whose number is a multiple of `every`) to a listener as soon as its stamps can be
read, so TensorBoard shows the steps while training goes on (ddp_lab/run/telemetry.py).

    for s in watch.steps(range(n), steps_done):   # wraps the loop's steps
        ...                                       # one training step
    # after each due step: on_step(step number, StepTimes, its collective calls)

It never waits for the device. On CPU a step is handed over as it ends; on CUDA its
stamps are events that fire when the GPU gets there, so it is handed over at the first
step end after they fired (usually a step or two later). A step's calls are those
recorded between its start and its end. The epoch's end still reads every stamp
(`StepTimer.collect`): what the watch had not handed over yet is written from there.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

from .comm import CommCall
from .comm_recorder import CommRecorder
from .steps import StepTimer, StepTimes


class StepWatch:
    """Every `every`-th step of `timer` and its calls on `comm`, handed to `on_step`."""

    def __init__(self, timer: StepTimer, comm: CommRecorder, every: int,
                 on_step: Callable[[int, StepTimes, list[CommCall]], None]):
        self.timer, self.comm, self.every, self.on_step = timer, comm, every, on_step

    def steps(self, steps: Iterable, done: int) -> Iterator:
        """`steps`, one epoch's (or its resumed part's), watched; `done`: global steps done
        before its first. Each due step is remembered with its index in the timer's list
        and the comm recorder's count at its start and end."""
        waiting: list[tuple[int, int, int, int]] = []  # (step number, index, first, end call)
        for i, s in enumerate(steps):
            number = done + i + 1
            due = number % self.every == 0
            first = self.comm.count() if due else 0
            yield s  # the loop runs step `number`
            if due:
                waiting.append((number, i, first, self.comm.count()))
            while waiting and self._hand_over(*waiting[0]):
                waiting.pop(0)

    def _hand_over(self, number: int, i: int, first: int, end: int) -> bool:
        """Step `number` to the listener if its stamps can be read now."""
        times = self.timer.ready(i)
        calls = None if times is None else self.comm.ready(first, end)
        if calls is None:
            return False
        self.on_step(number, times, calls)
        return True
