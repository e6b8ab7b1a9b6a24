"""One time base per rank: every stamp of a run (phases, collectives, compute end) is a `Clock`
stamp, so all of them lie on one timeline. CPU: `time.perf_counter()` (gloo calls block, so the
host clock times the work). CUDA: an event on the current stream, read once per epoch after one
synchronize and tied to the host clock by `anchor`; events come from a pool (`release` hands them
back), since making one costs the host more than recording it (docs/timing.md, "How communication
is timed").
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Optional

import torch


class Clock:
    """Seconds since the clock was made: made right after a barrier, every rank's zero is the same
    instant (to the barrier's exit skew), which lines the ranks up in a trace."""

    def __init__(self, device: torch.device, event: Optional[Callable[[], Any]] = None):
        """`event`: what makes one event (default a timing `torch.cuda.Event`); given on a CPU
        device, the clock stamps with those events as on CUDA (the pool's tests)."""
        self.cuda = device.type == "cuda" or event is not None
        self.device = device
        self.origin = time.perf_counter()
        self._anchor_event: Any = None
        self._anchor_s = 0.0
        self.make_event = event or _timing_event
        # CUDA: events read and handed back, to be recorded again
        self._free: list = []
        # CUDA: events made so far (a pool that works stops making them)
        self.made = 0
        # the hot path: a stamp is the bare host clock, no method around it
        if not self.cuda:
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
        """CUDA: an unrecorded event from the pool (a new one if it is empty)."""
        # (DDP's completion callbacks stamp from other threads: pop, never check)
        try:
            return self._free.pop()
        except IndexError:
            self.made += 1
            return self.make_event()

    def stamp(self) -> Any:
        if self.cuda:
            ev = self.event()
            # on the current stream: fires when the work queued before it is done
            ev.record()
            return ev
        return time.perf_counter()

    def release(self, stamps: Iterable[Any]) -> None:
        """Stamps read and not needed again go back to the pool (CUDA), each event once."""
        if self.cuda:
            self._free.extend(stamps)

    def ready(self, stamp: Any) -> bool:
        """Whether `stamp` can be read now without waiting (CUDA: its event has fired)."""
        return stamp.query() if self.cuda else True

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            # events must have completed to be read
            torch.cuda.synchronize(self.device)

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
    """What timing off hands to `with`: stamps nothing; one shared instance, no allocation."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


UNTIMED = _Untimed()
