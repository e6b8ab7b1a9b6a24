"""Phase timers and communication accounting.

One `Clock` per rank gives every timestamp of a run: `StepTimer` stamps the phases of
every step (data, forward, backward, sync, optim) and the synchroniser's `CommRecorder`
stamps every collective call. Both resolve their stamps once per epoch, on the same
time base, so a collective can be placed inside its step and phase.

- CPU: a stamp is `time.perf_counter()`. The work of a phase is finished when its Python
  call returns (gloo collectives block the caller; DDP's async ones are stamped in their
  completion callback), so the host clock times the work itself.
- CUDA: kernels are queued asynchronously, so a host clock would time the *launch*. A
  stamp is a CUDA event recorded on the current stream; events are read once per epoch,
  after a single synchronize, so timing adds no per-step host-device sync. `Clock.anchor`
  ties the device timeline to the host clock at each epoch start.

`CommStats` is what a synchroniser communicated in an epoch: calls, payload bytes, bytes
this rank sent and received (and, for a synchroniser that knows the node layout, the bytes
it sent to another node), and the time during which at least one of its collectives
was in flight; its bus bytes use nccl-tests' busbw factors (`ddp_lab.costmodel.busbw_factor`).

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

    compute end   = the moment the step's last gradient was ready: `GradReadyMark` stamps
                    every trainable parameter's `register_post_accumulate_grad_hook` (the
                    host clock on CPU; on CUDA a preallocated event re-recorded by each
                    hook, so it holds the last one), the last stamp of the step wins
    in-flight     = the union of the step's collective intervals (as above)
    exposed       = the part of that union that lies after compute end: communication
                    the rank could no longer hide behind its own backward, so it waited
                    for it (DDP: what backward waited for its last buckets; a blocking
                    synchroniser: all of its comm; reduce_broadcast: its reduces and the
                    parameter broadcast in the optim phase)
    compute       = forward + backward up to compute end (the model's own work)

Unlike "backward end - compute end + sync phase", this counts no pack/unpack copy or
averaging as communication, and exposed <= in-flight holds by construction. A step whose
hooks did not fire (timing off, no trainable parameter) takes its backward end as compute end.
"""

from __future__ import annotations

import bisect
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from . import progress as _progress
from .costmodel import busbw_factor

PHASES = ("data", "forward", "backward", "sync", "optim")


# ------------------------------------------------------------------ statistics
def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty sequence: the sorted value at
    index round(q/100 * (len-1)), so p0 is the minimum, p100 the maximum."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q}: must be in [0, 100]")
    s = sorted(values)
    return s[int(round(q / 100 * (len(s) - 1)))]


def describe(values: Sequence[float]) -> dict[str, float]:
    """mean, median, p95 and total of a list of seconds (zeros for an empty list)."""
    if not values:
        return {"mean": 0.0, "median": 0.0, "p95": 0.0, "total": 0.0}
    return {"mean": statistics.fmean(values), "median": statistics.median(values),
            "p95": percentile(values, 95), "total": float(sum(values))}


def union_length(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length covered by (start, end) intervals, overlaps counted once."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


# ------------------------------------------------------------------ the clock
class Clock:
    """This rank's time base: seconds since the clock was made.

    Make it right after a barrier and every rank's zero is the same instant,
    to within the barrier's exit skew: that is what lines the ranks up in a trace.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.origin = time.perf_counter()
        self._anchor_event: Any = None
        self._anchor_s = 0.0
        if not self.cuda:  # the hot path: a stamp is the bare host clock, no method around it
            self.stamp = time.perf_counter  # type: ignore[method-assign]

    def anchor(self) -> None:
        """Tie the device timeline to the host clock. Call it when the GPU is idle (after a
        synchronize), so the event runs the moment it is recorded."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._anchor_event = ev
            self._anchor_s = time.perf_counter() - self.origin

    def stamp(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()  # on the current stream: fires when the work queued before it is done
            return ev
        return time.perf_counter()

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)  # events must have completed to be read

    def seconds(self, stamp: Any) -> float:
        """A stamp in seconds on this time base (CUDA: after `synchronize`)."""
        if self.cuda:
            if self._anchor_event is None:
                raise RuntimeError("Clock.anchor() must be called before CUDA stamps are read")
            return self._anchor_s + self._anchor_event.elapsed_time(stamp) / 1e3
        return stamp - self.origin


# ------------------------------------------------------------------ phases
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


class _Nothing:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NOTHING = _Nothing()


class StepTimer:
    """Stamps the phases of every step; `collect()` resolves them once per epoch. Each phase
    and each step's end also mark this rank's progress record (ddp_lab.progress), timed or
    not: that is where a stuck rank is found."""

    def __init__(self, clock: Clock, enabled: bool = True):
        self.clock = clock
        self.enabled = enabled
        self.progress = _progress.current()
        self._steps: list[list] = []
        self._marks: list = []  # each step's compute-end stamp (GradReadyMark), or None
        self._current: list = []
        self._phases: dict[str, _Phase] = {}
        self.grads: Optional[GradReadyMark] = None

    def watch_grads(self, module: torch.nn.Module) -> None:
        """Stamp compute end (the step's last gradient ready) on `module`'s parameters."""
        if self.enabled:
            self.grads = GradReadyMark(self.clock, module)

    def phase(self, name: str):
        self.progress.phase(name)
        if not self.enabled:
            return _NOTHING
        ph = self._phases.get(name)
        if ph is None:
            ph = self._phases[name] = _Phase(self, name)
        return ph

    def end_step(self) -> None:
        self.progress.step_done()
        if self.enabled:
            self._steps.append(self._current)
            self._marks.append(self.grads.take() if self.grads is not None else None)
            self._current = []

    def collect(self) -> list[StepTimes]:
        """The steps since the last collect, in seconds (CUDA: one synchronize here)."""
        raw, self._steps = self._steps, []
        marks, self._marks = self._marks, []
        if self.grads is not None:
            self.grads.recycle()
        if not raw:
            return []
        self.clock.synchronize()
        sec = self.clock.seconds
        return [StepTimes([(n, sec(s), sec(e)) for n, s, e in spans],
                          None if m is None else sec(m)) for spans, m in zip(raw, marks)]


class GradReadyMark:
    """The moment the last gradient of a step was ready: compute end (module docstring).

    One `register_post_accumulate_grad_hook` per trainable parameter stamps it each time
    a gradient is accumulated; `take()` (at the step's end) hands over the last stamp and
    starts the next step's. CPU: the host clock (a float, no allocation). CUDA: the hook
    re-records the step's preallocated event on the stream that produced the gradient
    (re-recording keeps the latest); events come from a pool refilled once per epoch
    (`recycle`, after the epoch's stamps were read), so no step allocates one.
    """

    def __init__(self, clock: Clock, module: torch.nn.Module):
        self.clock = clock
        self.cuda = clock.cuda
        self.last: Any = None
        self._pool: list = []  # CUDA: free events
        self._used: list = []  # CUDA: events handed out this epoch
        self._event: Any = None
        self.handles = [p.register_post_accumulate_grad_hook(self._hook)
                        for p in module.parameters() if p.requires_grad]

    def _hook(self, _param: torch.Tensor) -> None:
        if not self.cuda:
            self.last = time.perf_counter()
            return
        if self._event is None:
            self._event = self._pool.pop() if self._pool else torch.cuda.Event(enable_timing=True)
        self._event.record()  # on the current stream: the one that produced this gradient
        self.last = self._event

    def take(self) -> Any:
        out, self.last = self.last, None
        if self.cuda and self._event is not None:
            self._used.append(self._event)
            self._event = None
        return out

    def recycle(self) -> None:
        """CUDA: the epoch's events were read; they go back to the pool."""
        self._pool.extend(self._used)
        self._used.clear()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def summarise_steps(steps: Sequence[StepTimes]) -> dict[str, dict[str, float]]:
    """mean/median/p95/total seconds per phase and for the whole step."""
    durs = [s.durations() for s in steps]
    out = {p: describe([d.get(p, 0.0) for d in durs]) for p in PHASES}
    out["step"] = describe([sum(d.values()) for d in durs])
    return out


# ------------------------------------------------------------------ communication
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


class _Timed:
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

    Blocking call:   `with rec.timed(op, payload, sent, recv): dist.all_reduce(buf)`
    Async call:      `start = rec.begin()` ... in its completion callback
                     `rec.finish(start, op, payload, sent, recv)`
    """

    def __init__(self, clock: Clock, world_size: int, enabled: bool = True):
        self.clock = clock
        self.world_size = world_size
        self.enabled = enabled
        self.progress = _progress.current()  # each call entered counts there
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
        st.bus_bytes += payload * busbw_factor(op, self.world_size)
        if cross_node is not None:
            st.bytes_cross_node = (st.bytes_cross_node or 0) + cross_node
        return CommCall(op, payload, sent, recv)

    def timed(self, op: str, payload: int, sent: int, recv: int,
              cross_node: Optional[int] = None):
        """`cross_node`: of `sent`, the bytes that go to another node (None: unknown)."""
        self.progress.collective(op)
        call = self._count(op, payload, sent, recv, cross_node)
        return _Timed(self, call) if self.enabled else _NOTHING

    def begin(self) -> Any:
        self.progress.collective()  # an async call (DDP's bucket all-reduce) is launched
        return self.clock.stamp() if self.enabled else None

    def finish(self, start: Any, op: str, payload: int, sent: int, recv: int,
               cross_node: Optional[int] = None) -> None:
        end = self.clock.stamp() if self.enabled else None
        with self._lock:
            call = self._count(op, payload, sent, recv, cross_node)
            if self.enabled:
                self._pending.append((call, start, end))

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
            out.timed.sort(key=lambda c: c.start)
            out.seconds = union_length([(c.start, c.end) for c in out.timed])
        return out


# ------------------------------------------------------------------ stragglers
# Who makes the others wait. Every rank's time blocked in (or, for DDP, waiting on) its
# collectives is measured per step (`CommStats.per_step_seconds`); the rank that arrives
# last at a step's collectives waits least, and every other rank waits about its lateness
# longer. So per step and rank: its lead = the median over the other ranks of (their comm
# time - its own), positive when the others waited for it; the step's last arriver is the
# rank with the largest lead. Durations on each rank's own clock: no offset between the
# ranks' clocks enters (arrival stamps would carry the exit skew of the barrier that set
# each rank's Clock zero: docs/sync.md "Stragglers" measures both against the truth).
#
# A rank's lateness is the median of its lead over *all* steps compared, not only those
# it came last at: with nothing injected the most-often-last rank then has a lateness
# near zero (the median over its last-steps alone is always positive: the largest of n
# noisy leads), and with a fixed delay the median is the delay, whatever the noise.
# A rank is named only when it is clearly the one (each threshold must hold):
STRAGGLER_MIN_STEPS = 20  # steps compared: fewer say nothing
STRAGGLER_MIN_SHARE = 0.5  # last in at least half the steps ...
STRAGGLER_CHANCE_FACTOR = 1.5  # ... and in 1.5x its chance share 1/n (n=2: 75%)
STRAGGLER_MIN_LATE_S = 0.5e-3  # its median lead: >= 0.5 ms


class StragglerTally:
    """Per rank: the steps at which it arrived last and its lead over the others at every
    step; summed over epochs with `merge` (the run's finding is made from all its steps,
    the same way)."""

    def __init__(self, world: int):
        self.world = world
        self.last = [0] * world
        self.lead_s: list[list[float]] = [[] for _ in range(world)]
        self.steps = 0

    @classmethod
    def from_waits(cls, waits: Sequence[Sequence[float]]) -> "StragglerTally":
        """`waits[rank][step]`: each rank's comm seconds per step (the same steps on every
        rank). Steps where every rank waited exactly as long (no collective) are skipped."""
        n = len(waits)
        t = cls(n)
        if n < 2 or len({len(w) for w in waits}) != 1:
            return t
        for col in zip(*waits):
            if max(col) == min(col):
                continue
            leads = [statistics.median(col[q] - col[r] for q in range(n) if q != r)
                     for r in range(n)]
            t.last[min(range(n), key=col.__getitem__)] += 1
            for r in range(n):
                t.lead_s[r].append(leads[r])
            t.steps += 1
        return t

    def merge(self, other: "StragglerTally") -> None:
        if other.world != self.world:
            return
        for r in range(self.world):
            self.last[r] += other.last[r]
            self.lead_s[r] += other.lead_s[r]
        self.steps += other.steps

    def share(self, rank: int) -> float:
        """The share of steps at which `rank` arrived last."""
        return self.last[rank] / self.steps if self.steps else 0.0

    def late_ms(self, rank: int) -> Optional[float]:
        """`rank`'s median lead over the others (ms): how long they wait for it."""
        return 1e3 * statistics.median(self.lead_s[rank]) if self.lead_s[rank] else None

    def evidence(self) -> dict[str, Any]:
        """Every rank's share of steps arrived last and its median lead (ms)."""
        return {"steps_compared": self.steps,
                "last_share": [round(self.share(r), 4) for r in range(self.world)],
                "late_ms": [None if (v := self.late_ms(r)) is None else round(v, 4)
                            for r in range(self.world)]}

    def named(self) -> Optional[dict[str, Any]]:
        """{rank, late_ms, share} of the rank the others wait for, or None when no rank is
        clearly the one (the thresholds above)."""
        if self.steps < STRAGGLER_MIN_STEPS:
            return None
        rank = max(range(self.world), key=self.share)
        share, late = self.share(rank), self.late_ms(rank)
        if (share < max(STRAGGLER_MIN_SHARE, STRAGGLER_CHANCE_FACTOR / self.world)
                or late is None or late < 1e3 * STRAGGLER_MIN_LATE_S):
            return None
        return {"rank": rank, "late_ms": round(late, 4), "share": round(share, 4)}


def stragglers(step_totals: Sequence[float],
               tally: Optional[StragglerTally] = None) -> dict[str, Any]:
    """An epoch's stragglers, all in one dict: the slowest and fastest rank by summed step
    time and, from the comm waits (`tally`), each rank's share of steps arrived last and
    its lateness then (the rank named from these is `tally.named()`)."""
    if not step_totals:
        return {}
    slow = max(range(len(step_totals)), key=lambda r: step_totals[r])
    fast = min(range(len(step_totals)), key=lambda r: step_totals[r])
    out = {"slowest_rank": slow, "slowest_s": step_totals[slow],
           "fastest_rank": fast, "fastest_s": step_totals[fast],
           "spread": (step_totals[slow] / step_totals[fast]) if step_totals[fast] > 0 else None,
           "per_rank_s": list(step_totals)}
    if tally is not None and tally.steps:
        out.update(tally.evidence())
    return out


def epoch_timing(steps: Sequence[StepTimes], comm: CommStats) -> dict[str, Any]:
    """Per-phase statistics, comm time per step and the comm share of step time."""
    phases = summarise_steps(steps)
    comm_steps = describe(comm.per_step_seconds(steps))
    exposed = float(sum(comm.per_step_exposed(steps)))
    step_total = phases["step"]["total"]
    fraction: Optional[float] = None
    exposed_fraction: Optional[float] = None
    if steps and step_total > 0:
        # in-flight comm / step time; clipped because an async collective may run on past
        # the last phase boundary of the step that launched it
        fraction = min(1.0, comm.seconds / step_total)
        exposed_fraction = min(1.0, exposed / step_total)
    return {"phases": phases, "comm_step": comm_steps, "comm_fraction": fraction,
            "exposed_s": exposed if steps else None, "exposed_fraction": exposed_fraction,
            "compute_s": float(sum(s.compute_seconds() for s in steps)) if steps else None}
