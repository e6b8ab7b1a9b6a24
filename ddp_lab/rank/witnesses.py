"""The witnesses: ddp_lab's comm figures from clocks not its own.

`trace_figures` reads torch.profiler's trace (its collectives, never
our `ddp_lab:` ranges); `ddp_figures` and `ddp_timing` read DDP's own
logging data (docs/timing.md, "Independent witnesses").
"""

from __future__ import annotations

import bisect
import json
import statistics
from pathlib import Path
from typing import Any, Optional

import torch

from ..predict.costmodel import union_length
from ..timing import PHASES

# ddp_lab's own ranges in the trace (what a witness must not use)
PREFIX = "ddp_lab:"


def ddp_timing(syncer: Any, profiler: Optional[Any]) -> Optional[dict]:
    """sync=ddp: DDP's own timing of this rank, in seconds: over every
    training step with the profiler on, else as DDP samples it. None
    without DDP (another sync, 1 rank)."""
    if profiler is not None:
        return profiler.ddp_timing()
    ddp = ddp_of(syncer.wrapped)
    if ddp is None:
        return None
    # DDP's running averages as DDP keeps them
    out = ddp_figures(ddp, None)
    # (not how many it averaged)
    out["last_logged_iteration"] = out.pop("iterations")
    return {**out, "every_iteration": False}


def ddp_of(model: torch.nn.Module) -> Optional[Any]:
    """The DistributedDataParallel the step calls (train.compile wraps
    it), or None."""
    from torch.nn.parallel import DistributedDataParallel

    ddp = getattr(model, "_orig_mod", model)
    return ddp if isinstance(ddp, DistributedDataParallel) else None


DDP_TIMES = ("avg_forward_compute_time", "avg_backward_compute_time",
             "avg_backward_comm_time", "avg_backward_compute_comm_overlap_time")


def ddp_averages(ddp: Any) -> dict:
    """DDP's running averages (ns) and how many iterations they are over
    (`iteration`, the last one logged: an iteration is logged by the
    next one's forward)."""
    data = ddp._get_ddp_logging_data()
    return {k: data.get(k) for k in (*DDP_TIMES, "iteration")}


def ddp_figures(ddp: Any, base: Optional[dict]) -> dict:
    """DDP's own averages in seconds over its logged training steps
    (`base` taken out)."""
    end = ddp_averages(ddp)
    n_end = end.get("iteration") or 0
    n_base = (base or {}).get("iteration") or 0
    out: dict = {"iterations": max(0, n_end - n_base), "preflight_excluded": n_base > 0}
    for k in DDP_TIMES:
        total = (end.get(k) or 0) * n_end - ((base or {}).get(k) or 0) * n_base
        n = n_end - n_base
        out[k.removeprefix("avg_") + "_s"] = total / n / 1e9 if n > 0 else None
    return out


def _collective(event: dict, cuda: bool) -> bool:
    """Whether a trace event is a torch-recorded collective (never one
    of our ranges)."""
    name = str(event.get("name", ""))
    if event.get("ph") != "X" or name.startswith(PREFIX):
        return False
    if cuda:
        return event.get("cat") == "kernel" and name.startswith("nccl")
    return name.startswith(("c10d::", "gloo:"))


def _next(times: list[float], t: float) -> float:
    """The first of the sorted `times` at or after `t`; `t` itself when
    there is none."""
    i = bisect.bisect_left(times, t)
    return times[i] if i < len(times) else t


def trace_figures(path: Path, blocking: bool = False, first: Optional[int] = None) -> dict:
    """A trace's own figures per `ProfilerStep#N` (the `first` ones
    where given): the median step's union of the collectives that start
    in its phases, and their count by name. `blocking`: a call lasts
    until the calling thread's next operator."""
    data = json.loads(path.read_text())
    events = [e for e in data.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    cuda = any(e.get("cat") == "kernel" for e in events)
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if str(e.get("name", "")).startswith("ProfilerStep#"))[:first]
    phases = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                    if e.get("name") in {PREFIX + p for p in PHASES})
    if not steps:
        return {}

    def in_phase(t: float) -> bool:
        i = bisect.bisect_right(phases, (t, float("inf"))) - 1
        return i >= 0 and phases[i][0] <= t <= phases[i][1]

    # CUDA: a kernel belongs to the step that launched it (its launch's
    # correlation id), wherever the GPU ran it; CPU: an op to the step
    # it starts in
    launched = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    colls = sorted((launched.get(e.get("args", {}).get("correlation"), e["ts"]) if cuda
                    else e["ts"], e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                   if _collective(e, cuda) and (cuda or in_phase(e["ts"])))
    if blocking and not cuda:
        # a blocking call's caller waits until its thread runs again:
        # gloo's op ends on its worker thread, the caller's next
        # operator in the trace starts when it resumed
        # the training loop's thread
        main = next((e.get("tid") for e in events
                     if str(e.get("name", "")).startswith("ProfilerStep#")), None)
        resumed = sorted(e["ts"] for e in events if e.get("tid") == main
                         and e.get("cat") == "cpu_op" and not _collective(e, cuda))
        colls = [(at, a, _next(resumed, b), name) for at, a, b, name in colls]
    per_step, counts = [], {}
    for s, e in steps:
        mine = [(a, b, name) for at, a, b, name in colls if s <= at < e]
        per_step.append(union_length([(a, b) for a, b, _ in mine]) / 1e6)
        for _, _, name in mine:
            counts[name] = counts.get(name, 0) + 1
    return {"steps": len(steps), "comm_per_step_s": statistics.median(per_step),
            "events": counts, "step_s": sum(e - s for s, e in steps) / len(steps) / 1e6,
            "source": "nccl kernels" if cuda else "c10d and gloo ops"}
