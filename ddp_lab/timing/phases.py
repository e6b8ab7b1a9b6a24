"""The phases of every step: `StepTimer` stamps them on the rank's
`Clock` while the epoch runs and resolves them into `StepTimes`
(seconds) once per epoch (docs/timing.md, "How communication is timed").

    with timer.phase("data"): ...      # data, forward, backward, sync, optim
    timer.end_step()

Phases are stamped on the sampled steps only (`sample`, set by the records at each epoch's start:
the live TensorBoard steps, the trace's, and at least `MIN_SAMPLED` an epoch); every other step
keeps one ("step", start, end) span, two stamps (docs/timing.md, "Which steps are sampled").
The timer keeps the phase running and the steps ended as plain attributes (`now`, `ended`) for the
heartbeat record to read. On CUDA a phase's end is the next one's start (one event per boundary,
from the clock's pool, handed back once read); on CPU each phase takes two stamps. `GradReadyMark`
stamps compute end, the step's last gradient ready (docs/timing.md, "Exposed vs in-flight comm").
`StepWatch` hands every `every`-th step to a listener as soon as its stamps can be read, never
waiting for the device (live TensorBoard, docs/timing.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import torch

from .clock import UNTIMED, Clock

PHASES = ("data", "forward", "backward", "sync", "optim")


@dataclass
class StepTimes:
    """One step: the (phase, start, end) seconds of each phase, in order."""

    spans: list[tuple[str, float, float]]
    # the step's last gradient ready (GradReadyMark)
    compute_end: Optional[float] = None
    # its phases stamped (a sampled step); False: one ("step", start, end) span
    phased: bool = True

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

    def seconds(self) -> float:
        """The step's time: its phases' sum (a sampled step), its one span (another)."""
        return sum(e - s for _, s, e in self.spans)

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


class GradReadyMark:
    """Compute end: a post-accumulate-grad hook per trainable parameter stamps it (CPU: the host
    clock; CUDA: re-records the step's pooled event on the gradient's stream, so it keeps the
    latest). The hooks are attached on sampled steps only (`on`): a hook is a call from autograd
    into Python per parameter, about 7 us each on CPU, even one that returns at once. `take()` at
    the step's end hands over the last stamp; `recycle()` returns the epoch's events to the
    clock's pool once read."""

    def __init__(self, clock: Clock, module: torch.nn.Module):
        self.clock = clock
        self.cuda = clock.cuda
        self.last: Any = None
        # CUDA: events handed out this epoch
        self._used: list = []
        self._event: Any = None
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.handles: list = []
        self.on = True

    @property
    def on(self) -> bool:
        """The hooks attached: this step is sampled."""
        return bool(self.handles)

    @on.setter
    def on(self, value: bool) -> None:
        if value and not self.handles:
            self.handles = [p.register_post_accumulate_grad_hook(self._hook) for p in self.params]
        elif not value:
            self.remove()

    def _hook(self, _param: torch.Tensor) -> None:
        if not self.cuda:
            self.last = time.perf_counter()
            return
        if self._event is None:
            self._event = self.clock.event()
        # on the current stream: the one that produced this gradient
        self._event.record()
        self.last = self._event

    def take(self) -> Any:
        out, self.last = self.last, None
        if self.cuda and self._event is not None:
            self._used.append(self._event)
            self._event = None
        return out

    def recycle(self) -> None:
        """CUDA: the epoch's events were read; they go back to the clock's pool."""
        self.clock.release(self._used)
        self._used = []

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


class _Phase:
    """`with timer.phase(name):`, a reused plain class: cheaper than a generator context."""

    __slots__ = ("timer", "name", "start", "stamp")

    def __init__(self, timer: "StepTimer", name: str):
        self.timer, self.name, self.start = timer, name, None
        self.stamp = timer.clock.stamp

    def __enter__(self) -> None:
        self.start = self.stamp()

    def __exit__(self, *exc: object) -> None:
        self.timer._current.append((self.name, self.start, self.stamp()))


class _SharedPhase:
    """`_Phase` on CUDA: starts at the previous phase's end event when there is one."""

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
    """Stamps each step: its phases on a sampled step, its start and end on the others;
    `collect()` resolves them once per epoch. `now` (the phase running, "step end" between steps)
    and `ended` (steps ended) are kept even untimed; `on_step_end()`, if given, is called as each
    step ends."""

    def __init__(self, clock: Clock, enabled: bool = True,
                 on_step_end: Optional[Callable[[], None]] = None):
        self.clock = clock
        self.enabled = enabled
        self.on_step_end = on_step_end
        self.now, self.ended = "", 0
        # each step since the last collect: (its spans, its compute-end stamp (GradReadyMark) or
        # None, its phases stamped)
        self._steps: list[tuple[list, Any, bool]] = []
        self._current: list = []
        self._phases: dict[str, object] = {}
        # CUDA: the current step's last boundary (a phase's end event)
        self._edge = None
        self.grads: Optional[GradReadyMark] = None
        # the steps (indices since the last collect) whose phases are stamped; None: every step
        self.sampled: Optional[frozenset[int]] = None
        # this step's phases stamped; else its start (the first phase's), once
        self._sampling, self._start = True, None

    def watch_grads(self, module: torch.nn.Module) -> None:
        """Stamp compute end (the step's last gradient ready) on `module`'s parameters."""
        if self.enabled:
            self.grads = GradReadyMark(self.clock, module)
            self.grads.on = self._sampling

    def sample(self, steps: Optional[Iterable[int]]) -> None:
        """From the next step on: the steps (indices since the last collect) whose phases are
        stamped; None: every step."""
        self.sampled = None if steps is None else frozenset(steps)
        self._next_step()

    def _next_step(self) -> None:
        self._sampling = self.sampled is None or len(self._steps) in self.sampled
        if self.grads is not None:
            self.grads.on = self._sampling

    def phase(self, name: str):
        self.now = name
        if not self.enabled:
            return UNTIMED
        if not self._sampling:
            if self._start is None:
                self._start = self.clock.stamp()
            return UNTIMED
        ph = self._phases.get(name)
        if ph is None:
            ph = self._phases[name] = (_SharedPhase if self.clock.cuda else _Phase)(self, name)
        return ph

    def end_step(self) -> None:
        if self.enabled:
            if self._sampling:
                self._steps.append((self._current,
                                    self.grads.take() if self.grads is not None else None, True))
            else:
                end = self.clock.stamp()
                self._steps.append(([("step", end if self._start is None else self._start, end)],
                                    None, False))
            self._current, self._edge, self._start = [], None, None
            self._next_step()
        self.now, self.ended = "step end", self.ended + 1
        # after: a listener may read the step (`ready`)
        if self.on_step_end is not None:
            self.on_step_end()

    def ready(self, i: int) -> Optional[StepTimes]:
        """Step `i` since the last collect, in seconds, if its stamps can be read now, else None
        (CUDA: not all its events fired). Never waits."""
        if i >= len(self._steps):
            return None
        spans, mark, phased = self._steps[i]
        ready = self.clock.ready
        if not (ready(spans[-1][2]) and (mark is None or ready(mark))):
            return None
        sec = self.clock.seconds
        return StepTimes([(n, sec(s), sec(e)) for n, s, e in spans],
                         None if mark is None else sec(mark), phased)

    def collect(self) -> list[StepTimes]:
        """The steps since the last collect, in seconds (CUDA: one synchronize here; the events
        then go back to the clock's pool)."""
        raw, self._steps = self._steps, []
        self._next_step()
        if not raw:
            if self.grads is not None:
                self.grads.recycle()
            return []
        self.clock.synchronize()
        sec = self.clock.seconds
        out = [StepTimes([(n, sec(s), sec(e)) for n, s, e in spans],
                         None if m is None else sec(m), p)
               for spans, m, p in raw]
        if self.grads is not None:
            self.grads.recycle()
        # each boundary once: a shared one is two spans' stamp
        if self.clock.cuda:
            self.clock.release({id(s): s for spans, _, _ in raw for _, a, b in spans
                                for s in (a, b)}.values())
        return out


class StepWatch:
    """Every `every`-th step of `timer` and its calls on `comm` (the synchroniser's `CommRecorder`:
    its `count` and `ready`), handed to `on_step(number, times, calls)`."""

    def __init__(self, timer: StepTimer, comm: Any, every: int,
                 on_step: Callable[[int, StepTimes, list], None]):
        self.timer, self.comm, self.every, self.on_step = timer, comm, every, on_step
        self.done = self.index = self.first = 0
        # (number, index, first, end call)
        self.waiting: list[tuple[int, int, int, int]] = []
        # the timer calls one listener: this one calls both
        heard = timer.on_step_end

        def step_ended() -> None:
            if heard is not None:
                heard()
            self._step_ended()

        timer.on_step_end = step_ended

    def begin(self, done: int) -> None:
        """An epoch (or its resumed part) starts, `done` global steps before its first."""
        self.done, self.index, self.waiting = done, 0, []
        self.first = self.comm.count()

    def _step_ended(self) -> None:
        # the recorder is read only around a step handed over: its calls are those between
        self.done, self.index = self.done + 1, self.index + 1
        every = self.every
        due = self.done % every == 0
        if due or (self.done + 1) % every == 0:
            end = self.comm.count()
            if due:
                self.waiting.append((self.done, self.index - 1, self.first, end))
            # the next step is handed over: its calls start here
            self.first = end
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
