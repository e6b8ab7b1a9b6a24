"""What a synchroniser communicates: `CommRecorder`, every synchroniser's `self.comm`
(ddp_lab/sync/synchroniser.py), counts every collective call's bytes and, with timing on, stamps
its start and end on the rank's `Clock`; `collect()` resolves them once per epoch into a `CommStats`. Then
the arithmetic that places the calls in the steps: in-flight comm is the union of this rank's
collective intervals, exposed comm the part of it after compute end, so exposed <= in-flight holds
by construction (docs/timing.md, "comm_fraction" and "Exposed vs in-flight comm").
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ..predict.costmodel import busbw_factors, union_length
from .clock import UNTIMED, Clock
from .phases import StepTimes


@dataclass
class CommCall:
    """One collective call as seen by this rank (times in seconds on the Clock's base)."""

    op: str
    payload: int
    sent: int
    recv: int
    start: float = 0.0
    end: float = 0.0


@dataclass
class CommStats:
    """What a synchroniser communicated since the last reset (this rank's view). `payload_bytes`:
    nccl-tests' "size"; `seconds`: in-flight time; `bus_bytes`: the sum over calls of payload *
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
        """In-flight comm seconds of each step (a call belongs to the step it starts in);
        `exposed`: only the part after the step's compute end."""
        buckets: list[list[tuple[float, float]]] = [[] for _ in steps]
        starts = [s.start for s in steps]
        for c in self.timed if steps else ():
            i = max(0, bisect.bisect_right(starts, c.start) - 1)
            cut = steps[i].compute_end_or_backward_end() if exposed else c.start
            if c.end > cut or not exposed:
                buckets[i].append((max(c.start, cut), c.end))
        return [union_length(b) for b in buckets]

    def per_step_exposed(self, steps: Sequence[StepTimes]) -> list[float]:
        """Exposed comm seconds of each step: its in-flight union after compute end."""
        return self.per_step_seconds(steps, exposed=True)


class _Timed:
    """`with rec.timed(...):` -- stamps one blocking call's start and end."""

    __slots__ = ("rec", "call", "start")

    def __init__(self, rec: "CommRecorder", call: CommCall):
        self.rec, self.call, self.start = rec, call, None

    def __enter__(self) -> None:
        self.start = self.rec.clock.stamp()

    def __exit__(self, exc_type, *exc: object) -> None:
        if exc_type is None:
            self.rec._pending.append((self.call, self.start, self.rec.clock.stamp()))


class CommRecorder:
    """A synchroniser's log of collective calls: bytes always, times when enabled.

    Blocking call: `with rec.timed(op, payload, sent, recv):
    dist.all_reduce(buf)` Async call: `start = rec.begin()` ... in its
    completion callback
                     `rec.finish(start, op, payload, sent, recv)`

    `entered` (calls entered) and `op` (the last one's; "" for an async
    call) are kept even untimed."""

    def __init__(self, clock: Clock, world_size: int, enabled: bool = True):
        self.clock = clock
        self.world_size = world_size
        self.enabled = enabled
        # each op's busbw factor, worked out once
        self.bus = busbw_factors(world_size)
        self.entered, self.op = 0, ""
        self._pending: list[tuple[CommCall, Any, Any]] = []
        self._stats = CommStats()
        # DDP's completion callbacks run on the backend's worker threads, several at once
        self._lock = threading.Lock()

    def _count(self, op: str, payload: int, sent: int, recv: int,
               cross_node: Optional[int] = None) -> CommCall:
        st = self._stats
        st.calls += 1
        st.payload_bytes += payload
        st.bytes_sent += sent
        st.bytes_recv += recv
        st.bus_bytes += payload * self.bus[op]
        if cross_node is not None:
            st.bytes_cross_node = (st.bytes_cross_node or 0) + cross_node
        return CommCall(op, payload, sent, recv)

    def timed(self, op: str, payload: int, sent: int, recv: int,
              cross_node: Optional[int] = None):
        """`cross_node`: of `sent`, the bytes that go to another node (None: unknown)."""
        self.entered, self.op = self.entered + 1, op
        call = self._count(op, payload, sent, recv, cross_node)
        return _Timed(self, call) if self.enabled else UNTIMED

    def begin(self) -> Any:
        # an async call (DDP's bucket) is launched
        self.entered, self.op = self.entered + 1, ""
        return self.clock.stamp() if self.enabled else None

    def finish(self, start: Any, op: str, payload: int, sent: int, recv: int,
               cross_node: Optional[int] = None) -> None:
        end = self.clock.stamp() if self.enabled else None
        with self._lock:
            call = self._count(op, payload, sent, recv, cross_node)
            if self.enabled:
                self._pending.append((call, start, end))

    COUNTS = ("calls", "payload_bytes", "bytes_sent", "bytes_recv", "bus_bytes")

    def counts(self) -> tuple:
        """Calls and bytes counted since the last collect (`COUNTS`, in that order)."""
        with self._lock:
            return tuple(getattr(self._stats, k) for k in self.COUNTS)

    def add_counts(self, delta: tuple, times: int = 1) -> None:
        """Count `times` (may be negative) more of `delta`, a `counts()` difference: a CUDA graph's
        replays launch the calls its capture counted once."""
        with self._lock:
            for k, d in zip(self.COUNTS, delta):
                setattr(self._stats, k, getattr(self._stats, k) + d * times)

    def count(self) -> int:
        """Timed calls recorded since the last collect (an index for `ready`)."""
        return len(self._pending)

    def ready(self, first: int, end: int) -> Optional[list[CommCall]]:
        """Timed calls `first` to `end` since the last collect, in seconds, if all their stamps can
        be read now, else None. Never waits (`StepWatch` reads steps with it)."""
        with self._lock:
            pending = self._pending[first:end]
        # each call's own: an overlap thread stamps on its stream
        ready = self.clock.ready
        if not all(ready(s) and ready(e) for _, s, e in pending):
            return None
        sec = self.clock.seconds
        return [CommCall(c.op, c.payload, c.sent, c.recv, sec(s), sec(e)) for c, s, e in pending]

    def collect(self) -> CommStats:
        """Everything since the last collect, resolved (CUDA: one synchronize here)."""
        with self._lock:
            out, self._stats = self._stats, CommStats()
            pending, self._pending = self._pending, []
        if pending:
            self.clock.synchronize()
            sec = self.clock.seconds
            for call, s, e in pending:
                call.start, call.end = sec(s), sec(e)
                out.timed.append(call)
            self.clock.release([s for _, a, b in pending for s in (a, b)])
            out.timed.sort(key=lambda c: c.start)
            out.seconds = union_length([(c.start, c.end) for c in out.timed])
        return out
