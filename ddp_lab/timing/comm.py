"""What a synchroniser communicated (`CommStats`, filled by a
`CommRecorder`), and the arithmetic that places it in the steps:
in-flight comm is the union of this rank's collective intervals, exposed
comm the part of it after compute end, so exposed <= in-flight holds by
construction (docs/timing.md, "comm_fraction" and "Exposed vs in-flight
comm").
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..predict.costmodel import union_length
from .phases import StepTimes


@dataclass
class CommCall:
    """One collective call as seen by this rank (times in seconds on the
    Clock's base)."""

    op: str
    payload: int
    sent: int
    recv: int
    start: float = 0.0
    end: float = 0.0


@dataclass
class CommStats:
    """What a synchroniser communicated since the last reset (this
    rank's view). `payload_bytes`: nccl-tests' "size"; `seconds`:
    in-flight time; `bus_bytes`: the sum over calls of payload *
    busbw_factor(op), so busbw mixes ops right (docs/timing.md)."""

    calls: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0
    payload_bytes: int = 0
    seconds: float = 0.0
    bus_bytes: float = 0.0
    timed: list[CommCall] = field(default_factory=list)
    #: bytes sent to another node; None unless the synchroniser knows
    #: the layout
    bytes_cross_node: Optional[int] = None

    @property
    def algbw(self) -> float:
        """GB/s: payload bytes / in-flight seconds."""
        return self.payload_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def busbw(self) -> float:
        """GB/s with nccl-tests' factors, per call's op."""
        return self.bus_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def per_step_seconds(self, steps: Sequence[StepTimes],
                         exposed: bool = False) -> list[float]:
        """In-flight comm seconds of each step (a call belongs to the
        step it starts in); `exposed`: only the part after the step's
        compute end."""
        buckets: list[list[tuple[float, float]]] = [[] for _ in steps]
        starts = [s.start for s in steps]
        for c in self.timed if steps else ():
            i = max(0, bisect.bisect_right(starts, c.start) - 1)
            cut = steps[i].compute_end_or_backward_end() if exposed else c.start
            if c.end > cut or not exposed:
                buckets[i].append((max(c.start, cut), c.end))
        return [union_length(b) for b in buckets]

    def per_step_exposed(self, steps: Sequence[StepTimes]) -> list[float]:
        """Exposed comm seconds of each step: its in-flight union after
        compute end."""
        return self.per_step_seconds(steps, exposed=True)
