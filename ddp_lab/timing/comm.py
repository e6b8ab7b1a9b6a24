"""What a synchroniser communicated, and the arithmetic that places it in the steps.

`CommStats` is what a synchroniser communicated in an epoch (a `CommRecorder` fills it,
ddp_lab/timing/comm_recorder.py): calls, payload bytes, bytes this rank sent and received
(and, for a synchroniser that knows the node layout, the bytes it sent to another node),
and the time during which at least one of its collectives was in flight; its bus bytes
use nccl-tests' busbw factors (`ddp_lab.measure.costmodel.busbw_factor`).

The communication share of step time (`comm_fraction` in metrics and summary) is

    comm_fraction = comm in-flight time / step time      (both summed over the epoch)

where "comm in-flight time" is the length of the union of this rank's collective
intervals (overlapping calls count once) and "step time" the sum of the phases. For the
blocking synchronisers (everything but ddp) the collectives sit on the critical path, so
this is exactly the share of the step spent communicating, whichever phase it falls in
(reduce_broadcast's parameter broadcast runs in the optim phase). For ddp the bucket
all-reduces overlap the backward pass: the same number is then the share of the step
during which communication was in flight, an upper bound on its exposed cost.

Exposed and in-flight communication (`comm_exposed_s`, `comm_inflight_s`, `compute_s`):

    compute end   = the moment the step's last gradient was ready (GradReadyMark, steps.py)
    in-flight     = the union of the step's collective intervals (as above)
    exposed       = the part of that union that lies after compute end: communication
                    the rank could no longer hide behind its own backward, so it waited
                    for it (DDP: what backward waited for its last buckets; a blocking
                    synchroniser: all of its comm; reduce_broadcast: its reduces and the
                    parameter broadcast in the optim phase)
    compute       = forward + backward up to compute end (the model's own work)

Unlike "backward end - compute end + sync phase", this counts no pack/unpack copy or
averaging as communication, and exposed <= in-flight holds by construction.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..measure.numbers import union_length
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
    """What a synchroniser communicated since the last reset (this rank's view).

    `payload_bytes` is the size of the data being synchronised (nccl-tests' "size"):
    for an all-reduce the gradient bytes, for reduce_broadcast the gradients reduced plus
    the parameters broadcast. `bytes_sent`/`bytes_recv` are this rank's own traffic.
    `seconds` is the in-flight time (union of call intervals); `bus_bytes` the sum over
    calls of payload * busbw_factor(op), so busbw = bus_bytes / seconds mixes ops right.
    """

    calls: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0
    payload_bytes: int = 0
    seconds: float = 0.0
    bus_bytes: float = 0.0
    timed: list[CommCall] = field(default_factory=list)
    #: bytes this rank sent to a rank on another node; None: the synchroniser does not
    #: know the node layout (only sync=hierarchical records it)
    bytes_cross_node: Optional[int] = None

    @property
    def algbw(self) -> float:
        """GB/s: payload bytes / in-flight seconds."""
        return self.payload_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def busbw(self) -> float:
        """GB/s with nccl-tests' factors, per call's op."""
        return self.bus_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def _step_of_each_call(self, steps: Sequence[StepTimes]) -> list[int]:
        """The index of the step each timed call belongs to: the one it starts in."""
        starts = [s.start for s in steps]
        return [max(0, bisect.bisect_right(starts, c.start) - 1) for c in self.timed]

    def per_step_seconds(self, steps: Sequence[StepTimes]) -> list[float]:
        """In-flight comm seconds of each step; a call belongs to the step it starts in."""
        buckets: list[list[tuple[float, float]]] = [[] for _ in steps]
        if steps:
            for i, c in zip(self._step_of_each_call(steps), self.timed):
                buckets[i].append((c.start, c.end))
        return [union_length(b) for b in buckets]

    def per_step_exposed(self, steps: Sequence[StepTimes]) -> list[float]:
        """Exposed comm seconds of each step: its in-flight union after compute end."""
        buckets: list[list[tuple[float, float]]] = [[] for _ in steps]
        if steps:
            for i, c in zip(self._step_of_each_call(steps), self.timed):
                cut = steps[i].compute_end_or_backward_end()
                if c.end > cut:
                    buckets[i].append((max(c.start, cut), c.end))
        return [union_length(b) for b in buckets]
