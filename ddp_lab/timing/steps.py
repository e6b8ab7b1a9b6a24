"""The phases of every step: `StepTimer` stamps them on the rank's `Clock` while the epoch
runs and resolves them into `StepTimes` (seconds) once per epoch.

    with timer.phase("data"): ...      # data, forward, backward, sync, optim
    timer.end_step()

The timer knows nothing of who else wants to hear of a phase: whoever builds it passes
listeners (`on_phase`, `on_step_end`). The training loop's `EpochMeter` (ddp_lab/rank/epoch.py)
passes the rank's progress record (ddp_lab/folder/progress.py), so a stuck rank can be found.

On CUDA a step's phases share their boundaries: the end of one phase is the start of the
next, one event each (a step of five phases records six), from the clock's pool, handed
back once read (`collect`). On CPU every phase takes its own two host-clock stamps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .clock import UNTIMED, Clock
from .grads import GradReadyMark

PHASES = ("data", "forward", "backward", "sync", "optim")


@dataclass
class StepTimes:
    """One step: the (phase, start, end) seconds of each phase, in order."""

    spans: list[tuple[str, float, float]]
    compute_end: Optional[float] = None  # the step's last gradient ready (GradReadyMark)

    @property
    def start(self) -> float:
        return self.spans[0][1] if self.spans else 0.0

    @property
    def end(self) -> float:
        return self.spans[-1][2] if self.spans else 0.0

    def durations(self) -> dict[str, float]:
        d: dict[str, float] = {}
        for name, s, e in self.spans:
            d[name] = d.get(name, 0.0) + (e - s)
        return d

    def compute_end_or_backward_end(self) -> float:
        """compute end; without a mark, the end of the step's last backward span."""
        if self.compute_end is not None:
            return self.compute_end
        ends = [e for name, _, e in self.spans if name == "backward"]
        return ends[-1] if ends else self.end

    def compute_seconds(self) -> float:
        """forward + backward, the last backward span cut at compute end."""
        end = self.compute_end_or_backward_end()
        total = 0.0
        for name, s, e in self.spans:
            if name == "forward":
                total += e - s
            elif name == "backward":
                total += max(0.0, min(e, end) - s) if s <= end else 0.0
        return total


class _Phase:
    """`with timer.phase(name):` -- a plain class, cheaper than a generator context, made
    once per phase name and reused every step (a phase never nests inside itself)."""

    __slots__ = ("timer", "name", "start", "stamp")

    def __init__(self, timer: "StepTimer", name: str):
        self.timer, self.name, self.start = timer, name, None
        self.stamp = timer.clock.stamp

    def __enter__(self) -> None:
        self.start = self.stamp()

    def __exit__(self, *exc: object) -> None:
        self.timer._current.append((self.name, self.start, self.stamp()))


class _SharedPhase:
    """`_Phase` on CUDA: the phase starts at the step's last boundary (the previous phase's
    end event) when there is one, so a step records one event per boundary."""

    __slots__ = ("timer", "name", "start")

    def __init__(self, timer: "StepTimer", name: str):
        self.timer, self.name, self.start = timer, name, None

    def __enter__(self) -> None:
        t = self.timer
        self.start = t._edge if t._edge is not None else t.clock.stamp()

    def __exit__(self, *exc: object) -> None:
        t = self.timer
        t._edge = end = t.clock.stamp()
        t._current.append((self.name, self.start, end))


class StepTimer:
    """Stamps the phases of every step; `collect()` resolves them once per epoch.

    Listeners, called timed or not: `on_phase(name)` as each phase starts and
    `on_step_end()` as each step ends. One callable each, called directly: a listener
    costs the step one call per phase and allocates nothing (to have several, pass one
    function that calls them)."""

    def __init__(self, clock: Clock, enabled: bool = True,
                 on_phase: Optional[Callable[[str], None]] = None,
                 on_step_end: Optional[Callable[[], None]] = None):
        self.clock = clock
        self.enabled = enabled
        self.on_phase, self.on_step_end = on_phase, on_step_end
        self._steps: list[list] = []
        self._marks: list = []  # each step's compute-end stamp (GradReadyMark), or None
        self._current: list = []
        self._phases: dict[str, object] = {}
        self._edge = None  # CUDA: the current step's last boundary (a phase's end event)
        self.grads: Optional[GradReadyMark] = None

    def watch_grads(self, module: torch.nn.Module) -> None:
        """Stamp compute end (the step's last gradient ready) on `module`'s parameters."""
        if self.enabled:
            self.grads = GradReadyMark(self.clock, module)

    def phase(self, name: str):
        if self.on_phase is not None:
            self.on_phase(name)
        if not self.enabled:
            return UNTIMED
        ph = self._phases.get(name)
        if ph is None:
            ph = self._phases[name] = (_SharedPhase if self.clock.cuda else _Phase)(self, name)
        return ph

    def end_step(self) -> None:
        if self.enabled:
            self._steps.append(self._current)
            self._marks.append(self.grads.take() if self.grads is not None else None)
            self._current, self._edge = [], None
        if self.on_step_end is not None:  # after: a listener may read the step (`ready`)
            self.on_step_end()

    def ready(self, i: int) -> Optional[StepTimes]:
        """Step `i` of those since the last collect, in seconds, if it has ended and its
        stamps can be read now; None if not yet (CUDA: its events have not all fired).
        Never waits: the live TensorBoard points read steps with it (timing/live.py)."""
        if i >= len(self._steps):
            return None
        spans, mark = self._steps[i], self._marks[i]
        ready = self.clock.ready
        if not (ready(spans[-1][2]) and (mark is None or ready(mark))):
            return None
        sec = self.clock.seconds
        return StepTimes([(n, sec(s), sec(e)) for n, s, e in spans],
                         None if mark is None else sec(mark))

    def collect(self) -> list[StepTimes]:
        """The steps since the last collect, in seconds (CUDA: one synchronize here; the
        events then go back to the clock's pool)."""
        raw, self._steps = self._steps, []
        marks, self._marks = self._marks, []
        if not raw:
            if self.grads is not None:
                self.grads.recycle()
            return []
        self.clock.synchronize()
        sec = self.clock.seconds
        out = [StepTimes([(n, sec(s), sec(e)) for n, s, e in spans],
                         None if m is None else sec(m)) for spans, m in zip(raw, marks)]
        if self.grads is not None:
            self.grads.recycle()
        if self.clock.cuda:  # each boundary once: a shared one is two spans' stamp
            self.clock.release({id(s): s for spans in raw for _, a, b in spans
                                for s in (a, b)}.values())
        return out
