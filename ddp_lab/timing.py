"""Phase timers and communication accounting.

`StepTimer` times the phases of every step (data, forward, backward, sync, optim). On
CPU it reads a monotonic clock at phase boundaries; the work of a phase is finished when
its Python call returns (gloo collectives are synchronous from the caller's view). On
CUDA, kernels are queued asynchronously, so a host clock would time the *launch*; the
timer records CUDA events on the current stream instead and resolves them once per epoch,
after a single synchronize, so timing adds no per-step host-device sync.

`CommStats` accumulates what a synchroniser sent: calls, bytes, time; `busbw_factor` gives
nccl-tests' bus-bandwidth factors (all-reduce 2(n-1)/n, all-gather and reduce-scatter
(n-1)/n, broadcast/reduce/send-recv 1).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

PHASES = ("data", "forward", "backward", "sync", "optim")


def busbw_factor(op: str, world_size: int) -> float:
    n = world_size
    if n <= 1:
        return 0.0 if op in ("all_reduce", "all_gather", "reduce_scatter") else 1.0
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op in ("broadcast", "reduce", "send_recv", "reduce_broadcast", "p2p"):
        return 1.0
    raise ValueError(f"no bus-bandwidth factor for op {op!r}")


def bandwidth(nbytes: float, seconds: float, op: str, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s), as nccl-tests defines them."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * busbw_factor(op, world_size)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty list."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(q / 100 * (len(s) - 1)))))
    return s[k]


def describe(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "median": 0.0, "p95": 0.0, "total": 0.0}
    return {"mean": statistics.fmean(values), "median": statistics.median(values),
            "p95": percentile(values, 95), "total": float(sum(values))}


@dataclass
class CommStats:
    """What a synchroniser communicated since the last reset (this rank's view)."""

    calls: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0
    payload_bytes: int = 0  # the size of the data being synchronised (nccl-tests' "size")
    seconds: float = 0.0

    def add(self, payload: int, sent: int, recv: int, seconds: float = 0.0) -> None:
        self.calls += 1
        self.payload_bytes += payload
        self.bytes_sent += sent
        self.bytes_recv += recv
        self.seconds += seconds

    def reset(self) -> "CommStats":
        out = CommStats(self.calls, self.bytes_sent, self.bytes_recv, self.payload_bytes, self.seconds)
        self.calls = self.bytes_sent = self.bytes_recv = self.payload_bytes = 0
        self.seconds = 0.0
        return out


@dataclass
class StepTimer:
    device: torch.device
    enabled: bool = True
    _cpu: list[dict[str, float]] = field(default_factory=list)
    _cuda: list[list[tuple[str, object, object]]] = field(default_factory=list)
    _current: dict = field(default_factory=dict)
    _events: list = field(default_factory=list)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((name, start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._current[name] = self._current.get(name, 0.0) + time.perf_counter() - t0

    def end_step(self) -> None:
        if not self.enabled:
            return
        if self.cuda:
            self._cuda.append(self._events)
            self._events = []
        else:
            self._cpu.append(self._current)
            self._current = {}

    def collect(self) -> list[dict[str, float]]:
        """Per-step phase seconds since the last collect; resolves CUDA events (one sync)."""
        if self.cuda and self._cuda:
            torch.cuda.synchronize(self.device)  # events must have completed to be read
            steps = []
            for events in self._cuda:
                d: dict[str, float] = {}
                for name, s, e in events:
                    d[name] = d.get(name, 0.0) + s.elapsed_time(e) / 1e3
                steps.append(d)
            self._cuda = []
            return steps
        steps, self._cpu = self._cpu, []
        return steps


def summarise_steps(steps: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """mean/median/p95/total per phase and for the whole step."""
    out = {p: describe([s.get(p, 0.0) for s in steps]) for p in PHASES}
    out["step"] = describe([sum(s.values()) for s in steps])
    return out
