"""One time base per rank: every stamp of a run (phases, collectives, compute end) is a
`Clock` stamp, so all of them can be laid on one timeline and compared.

- CPU: a stamp is `time.perf_counter()`. The work of a phase is finished when its Python
  call returns (gloo collectives block the caller; DDP's async ones are stamped in their
  completion callback), so the host clock times the work itself.
- CUDA: kernels are queued asynchronously, so a host clock would time the *launch*. A
  stamp is a CUDA event recorded on the current stream; events are read once per epoch,
  after a single synchronize, so timing adds no per-step host-device sync. `Clock.anchor`
  ties the device timeline to the host clock at each epoch start. Events come from a
  pool: whoever read its stamps hands them back (`release`), so after the first epoch no
  step makes an event (creating one costs the host more than recording it).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Optional

import torch


class Clock:
    """This rank's time base: seconds since the clock was made.

    Make it right after a barrier and every rank's zero is the same instant,
    to within the barrier's exit skew: that is what lines the ranks up in a trace.
    """

    def __init__(self, device: torch.device, event: Optional[Callable[[], Any]] = None):
        """`event`: what makes one event (default a timing `torch.cuda.Event`); given on a
        CPU device, the clock stamps with those events as on CUDA (the pool's tests)."""
        self.cuda = device.type == "cuda" or event is not None
        self.device = device
        self.origin = time.perf_counter()
        self._anchor_event: Any = None
        self._anchor_s = 0.0
        self.make_event = event or _timing_event
        self._free: list = []  # CUDA: events read and handed back, to be recorded again
        self.made = 0  # CUDA: events made so far (a pool that works stops making them)
        if not self.cuda:  # the hot path: a stamp is the bare host clock, no method around it
            self.stamp = time.perf_counter  # type: ignore[method-assign]

    def anchor(self) -> None:
        """Tie the device timeline to the host clock. Call it when the GPU is idle (after a
        synchronize), so the event runs the moment it is recorded."""
        if self.cuda:
            if self._anchor_event is None:
                self._anchor_event = self.make_event()
            self._anchor_event.record()
            self._anchor_s = time.perf_counter() - self.origin

    def event(self) -> Any:
        """CUDA: an event from the pool (a new one if it is empty), not yet recorded: what
        `stamp` records, and what `GradReadyMark` (timing/phases.py) re-records in its hooks."""
        try:  # (DDP's completion callbacks stamp from other threads: pop, never check)
            return self._free.pop()
        except IndexError:
            self.made += 1
            return self.make_event()

    def stamp(self) -> Any:
        if self.cuda:
            ev = self.event()
            ev.record()  # on the current stream: fires when the work queued before it is done
            return ev
        return time.perf_counter()

    def release(self, stamps: Iterable[Any]) -> None:
        """Stamps that were read (`seconds`, after `synchronize`) and are not needed again:
        CUDA, their events go back to the pool; CPU, nothing. Each event once."""
        if self.cuda:
            self._free.extend(stamps)

    def ready(self, stamp: Any) -> bool:
        """Whether `stamp` can be read now without waiting (CUDA: its event has fired)."""
        return stamp.query() if self.cuda else True

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # events must have completed to be read

    def seconds(self, stamp: Any) -> float:
        """A stamp in seconds on this time base (CUDA: after `synchronize`)."""
        if self.cuda:
            if self._anchor_event is None:
                raise RuntimeError("Clock.anchor() must be called before CUDA stamps are read")
            return self._anchor_s + self._anchor_event.elapsed_time(stamp) / 1e3
        return stamp - self.origin


def _timing_event() -> Any:
    return torch.cuda.Event(enable_timing=True)


class _Untimed:
    """What a timer or recorder with timing off hands to `with`: it stamps nothing. One
    shared instance (`UNTIMED`), so timing off allocates nothing per phase or call."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


UNTIMED = _Untimed()
