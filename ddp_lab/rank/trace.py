"""A timeline of the run in Chrome's trace event format (docs/timing.md,
"What is written").

Every rank writes `trace/rank<N>.json` (pid = rank; tid = rank: the step
phases; tid = 1000 + rank: its collectives); at the end rank 0 writes
`trace/all.json`, every rank in one file. Times are microseconds since a
clock started after a barrier. Of each epoch only the first and last
`trace_steps` steps are kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from ..folder.files import atomic_write_text
from ..timing import CommStats, StepTimes

COMM_TID = 1000


def kept_steps(n_steps: int, keep: int) -> list[int]:
    """Indices of the first `keep` and last `keep` of `n_steps` steps
    (each once)."""
    if keep <= 0:
        return []
    return sorted(set(range(min(keep, n_steps))) | set(range(max(0, n_steps - keep), n_steps)))


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def metadata(rank: int) -> list[dict[str, Any]]:
    return [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": rank, "args": {"name": f"rank {rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": rank, "args": {"sort_index": rank}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": rank, "args": {"name": "phases"}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": COMM_TID + rank,
         "args": {"name": "collectives"}},
    ]


def epoch_events(rank: int, epoch: int, steps: Sequence[StepTimes], comm: CommStats,
                 keep: int, step_offset: int = 0) -> list[dict[str, Any]]:
    """Trace events of one epoch: kept steps' phases, and the
    collectives started in them."""
    idx = kept_steps(len(steps), keep)
    events: list[dict[str, Any]] = []
    windows = []
    for i in idx:
        st = steps[i]
        step = step_offset + i
        windows.append((st.start, st.end, step))
        for name, s, e in st.spans:
            events.append({"name": name, "ph": "X", "ts": _us(s), "dur": _us(e - s),
                           "pid": rank, "tid": rank, "cat": "phase",
                           "args": {"epoch": epoch, "step": step}})
    for c in comm.timed:
        for s, e, step in windows:
            if s <= c.start <= e:
                events.append({"name": c.op, "ph": "X", "ts": _us(c.start),
                               "dur": _us(c.end - c.start), "pid": rank, "tid": COMM_TID + rank,
                               "cat": "comm",
                               "args": {"epoch": epoch, "step": step, "payload_bytes": c.payload,
                                        "bytes_sent": c.sent, "bytes_recv": c.recv}})
                break
    return events


class TraceWriter:
    """Accumulates the bounded events of each epoch and rewrites the
    rank's file."""

    def __init__(self, run_dir: Path, rank: int, keep: int, enabled: bool = True):
        self.path = run_dir / "trace" / f"rank{rank}.json"
        self.rank, self.keep, self.enabled = rank, keep, enabled
        self.events: list[dict[str, Any]] = metadata(rank)

    def add_epoch(self, epoch: int, steps: Sequence[StepTimes], comm: CommStats,
                  first_step: int = 0) -> None:
        """Add an epoch's kept steps (numbered from `first_step`) and
        rewrite the file."""
        if not self.enabled:
            return
        self.events += epoch_events(self.rank, epoch, steps, comm, self.keep, first_step)
        write_trace(self.path, self.events)


def write_trace(path: Path, events: list[dict[str, Any]]) -> None:
    """Atomically (re)write a trace file: readers see the old one or the
    new one."""
    atomic_write_text(path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"},
                                       separators=(",", ":")))
