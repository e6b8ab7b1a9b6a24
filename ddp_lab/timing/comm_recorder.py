"""A synchroniser's log of its collective calls: `CommRecorder`, every
synchroniser's `self.comm` (ddp_lab/sync/synchroniser.py), so comm time is
measured the same way for all. It counts every call's bytes and, with
timing on, stamps start and end on the rank's `Clock`; `collect()`
resolves them once per epoch into a `CommStats`.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from ..predict.costmodel import busbw_factors
from .clock import UNTIMED, Clock
from .comm import CommCall, CommStats, union_length


class _Timed:
    """`with rec.timed(...):` -- stamps one blocking call's start and
    end."""

    __slots__ = ("rec", "call", "start")

    def __init__(self, rec: "CommRecorder", call: CommCall):
        self.rec, self.call, self.start = rec, call, None

    def __enter__(self) -> None:
        self.start = self.rec.clock.stamp()

    def __exit__(self, exc_type, *exc: object) -> None:
        if exc_type is None:
            self.rec._pending.append((self.call, self.start, self.rec.clock.stamp()))


class CommRecorder:
    """A synchroniser's log of collective calls: bytes always, times
    when enabled.

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
        # DDP's completion callbacks run on the backend's worker
        # threads, several at once
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
        """`cross_node`: of `sent`, the bytes that go to another node
        (None: unknown)."""
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
        """Calls and bytes counted since the last collect (`COUNTS`, in
        that order)."""
        with self._lock:
            return tuple(getattr(self._stats, k) for k in self.COUNTS)

    def add_counts(self, delta: tuple, times: int = 1) -> None:
        """Count `times` (may be negative) more of `delta`, a `counts()`
        difference: a CUDA graph's replays launch the calls its capture
        counted once."""
        with self._lock:
            for k, d in zip(self.COUNTS, delta):
                setattr(self._stats, k, getattr(self._stats, k) + d * times)

    def count(self) -> int:
        """Timed calls recorded since the last collect (an index for
        `ready`)."""
        return len(self._pending)

    def ready(self, first: int, end: int) -> Optional[list[CommCall]]:
        """Timed calls `first` to `end` since the last collect, in
        seconds, if all their stamps can be read now, else None. Never
        waits (`StepWatch` reads steps with it)."""
        with self._lock:
            pending = self._pending[first:end]
        # each call's own: an overlap thread stamps on its stream
        ready = self.clock.ready
        if not all(ready(s) and ready(e) for _, s, e in pending):
            return None
        sec = self.clock.seconds
        return [CommCall(c.op, c.payload, c.sent, c.recv, sec(s), sec(e)) for c, s, e in pending]

    def collect(self) -> CommStats:
        """Everything since the last collect, resolved (CUDA: one
        synchronize here)."""
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
