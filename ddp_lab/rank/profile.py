"""`timing.profile=true`: torch.profiler over a few steps on every rank, and the witnesses that
check ddp_lab's own figures against clocks not its own (docs/timing.md, "Independent witnesses":
what each figure means and how far they should agree).

`StepProfiler` traces `timing.profile_steps` steps after `timing.profile_skip` into
`profile/rank<N>.pt.trace.json`, labelling the phases and blocking collectives (`ddp_lab:<name>`,
NVTX on CUDA) by wrapping the timer's `phase` and the recorder's `timed` for the window only.
Witnesses read the trace's own collectives, never our ranges.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import os
import statistics
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

from ..config import TimingConfig
from ..predict.costmodel import union_length
from ..timing import PHASES, CommStats, StepTimes

log = logging.getLogger("ddp_lab")

# Kineto (torch.profiler's C++ side) prints to stderr at or above its level: ERROR (4) by default,
# USDT (5) lines on every start and stop, and on a CUDA build without a driver `ERROR: ...
# gpuGetDeviceCount failed with code 35` on a healthy CPU run. 6 is above its highest: none. Read
# once, when the profiler first starts; a user's own KINETO_LOG_LEVEL wins (docs/timing.md).
KINETO_QUIET = "6"


@contextlib.contextmanager
def _labelled(name: str, inner: Any, nvtx: bool) -> Iterator[None]:
    """A `record_function` range (and on CUDA an NVTX range) around the timer's context `inner`."""
    with torch.profiler.record_function(name), \
            torch.cuda.nvtx.range(name) if nvtx else contextlib.nullcontext(), inner:
        yield


class StepProfiler:
    """torch.profiler over a window of steps, the phases labelled; see the module docstring."""

    def __init__(self, timing: TimingConfig, rank: int, device: torch.device, run_dir: Path,
                 timer: Any, syncer: Any):
        self.skip, self.active = int(timing.profile_skip), int(timing.profile_steps)
        self.rank, self.timer, self.comm = rank, timer, syncer.comm
        self.path = run_dir / "profile" / f"rank{rank}.pt.trace.json"
        self.cuda = device.type == "cuda"
        # sync=ddp in a world > 1: DDP's own timing too
        self.ddp = ddp_of(syncer.wrapped)
        # the caller waits for each collective (every sync but ddp and sync.overlap)
        self.blocking = self.ddp is None and not getattr(syncer, "overlapped", False)
        # every iteration from now (the preflight's is iteration 1)
        if self.ddp is not None:
            self.ddp._set_ddp_runtime_logging_sample_rate(1)
        self.ddp_base: Optional[dict] = None  # DDP's averages after the preflight alone
        kinds = torch.profiler.ProfilerActivity
        warmup = 1 if self.skip > 0 else 0  # the profiler's own warm-up step, within the skip
        os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET)  # before Kineto initialises
        self.prof = torch.profiler.profile(
            activities=[kinds.CPU, *([kinds.CUDA] if self.cuda else [])], on_trace_ready=self._write,
            schedule=torch.profiler.schedule(wait=self.skip - warmup, warmup=warmup,
                                             active=self.active, repeat=1))
        self.steps = 0  # steps ended since the profiler started
        self.ours: Optional[dict] = None  # ddp_lab's figures for the window's steps
        self.run_steps, self.run_inflight, self.run_exposed, self.run_compute = 0, 0.0, 0.0, 0.0
        self.written = False
        self._attach()
        self.prof.start()

    def _attach(self) -> None:
        """Wrap the timer's `phase`, the recorder's `timed` and the step end as instance
        attributes over the class's methods (`_detach` removes them)."""
        timer, comm, nvtx = self.timer, self.comm, self.cuda
        phase, timed, step_end = timer.phase, comm.timed, timer.on_step_end

        def labelled_phase(name: str) -> Any:
            return _labelled(PREFIX + name, phase(name), nvtx)

        def labelled_call(op: str, *args: Any, **kw: Any) -> Any:
            return _labelled(PREFIX + op, timed(op, *args, **kw), nvtx)

        def on_step_end() -> None:
            if step_end is not None:
                step_end()
            self._step()

        timer.phase, comm.timed, timer.on_step_end = labelled_phase, labelled_call, on_step_end
        self._step_end = step_end

    def _detach(self) -> None:
        for obj, name in ((self.timer, "phase"), (self.comm, "timed")):
            obj.__dict__.pop(name, None)
        self.timer.on_step_end = self._step_end

    def _step(self) -> None:
        self.steps += 1
        # the preflight's figures (iteration 1) were logged by this step's forward
        if self.steps == 1 and self.ddp is not None:
            self.ddp_base = ddp_averages(self.ddp)
        self.prof.step()
        if self.steps >= self.skip + self.active:
            self.stop()

    def stop(self) -> None:
        """End the window (its trace is written) and unwrap; idempotent."""
        if self.prof is not None:
            self._detach()
            self.prof.stop()
            self.prof = None

    def _write(self, prof: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        prof.export_chrome_trace(str(tmp))
        tmp.replace(self.path)  # atomic: a reader never sees half a trace
        self.written = True

    def measured(self, steps: list[StepTimes], comm: CommStats) -> None:
        """Each epoch's steps and calls (Records.steps_measured): the first epoch's give ddp_lab's
        figures for the window (ended here at the latest); every epoch adds to this rank's sums."""
        inflight, exposed = comm.per_step_seconds(steps), comm.per_step_exposed(steps)
        self.run_steps += len(steps)
        self.run_inflight += sum(inflight)
        self.run_exposed += sum(exposed)
        self.run_compute += sum(st.compute_seconds() for st in steps)
        if self.ours is not None:
            return
        self.stop()
        window = range(self.skip, min(self.skip + self.active, len(steps)))
        self.ours = {}
        if not window:
            return
        first, end = steps[window.start].start, steps[window.stop - 1].end
        calls = [c for c in comm.timed if first <= c.start < end]
        n = len(window)
        self.ours = {
            "steps": n,
            # medians: one step a busy machine preempted mid-call moves a mean, not these
            "comm_per_step_s": statistics.median(inflight[i] for i in window),
            "exposed_per_step_s": statistics.median(exposed[i] for i in window),
            "compute_per_step_s": sum(steps[i].compute_seconds() for i in window) / n,
            "step_s": sum(steps[i].end - steps[i].start for i in window) / n,
            "calls": len(calls),
            "call_s": sum(c.end - c.start for c in calls) / len(calls) if calls else None,
        }

    def witnesses(self, ctx: Any) -> Optional[dict]:
        """Collective. Every rank's figures for the window and its trace's, on the logging rank
        (None on the others): what summary.json keeps as `witnesses`."""
        self.stop()
        mine = {"rank": self.rank, "ddp_lab": self.ours or {},
                # the steps ddp_lab timed: where the first epoch ended inside the window, the
                # profiler's last step is the rest of the epoch (evaluation), no step
                "profiler": trace_figures(self.path, self.blocking, (self.ours or {}).get("steps"))
                if self.written else {},
                "trace": f"profile/{self.path.name}" if self.written else None}
        ranks = ctx.gather_objects_to(mine, dst=0)
        if ranks is None or not ctx.env.is_main:
            return None
        return {"window": {"skip": self.skip, "steps": self.active},
                "device": "cuda" if self.cuda else "cpu", "ranks": ranks}


def make_profiler(timing: TimingConfig, rank: int, device: torch.device, run_dir: Path,
                  timer: Any, syncer: Any) -> Optional[StepProfiler]:
    """The run's profiler when `timing.profile` is on, else None."""
    return StepProfiler(timing, rank, device, run_dir, timer, syncer) if timing.profile else None


# ------------------------------------------------------------------ the witnesses
PREFIX = "ddp_lab:"  # ddp_lab's own ranges in the trace (what a witness must not use)


def ddp_timing(syncer: Any, profiler: Optional[StepProfiler]) -> Optional[dict]:
    """sync=ddp: DDP's own timing of this rank, in seconds. With the profiler on, over every
    training step (the preflight's iteration taken out) beside ddp_lab's over all the run's steps;
    else as DDP samples it. None without DDP (another sync, 1 rank)."""
    ddp = ddp_of(syncer.wrapped)
    if ddp is None:
        return None
    if profiler is None:
        out = ddp_figures(ddp, None)  # DDP's running averages as DDP keeps them
        out["last_logged_iteration"] = out.pop("iterations")  # (not how many it averaged)
        return {**out, "every_iteration": False}
    p, n = profiler, profiler.run_steps
    return {**ddp_figures(ddp, p.ddp_base), "every_iteration": True,
            "ddp_lab": {"comm_per_step_s": p.run_inflight / n if n else None,
                        "hidden_per_step_s": (p.run_inflight - p.run_exposed) / n if n else None,
                        "compute_per_step_s": p.run_compute / n if n else None, "steps": n}}


def ddp_of(model: torch.nn.Module) -> Optional[Any]:
    """The DistributedDataParallel the step calls (train.compile wraps it), or None."""
    from torch.nn.parallel import DistributedDataParallel

    ddp = getattr(model, "_orig_mod", model)
    return ddp if isinstance(ddp, DistributedDataParallel) else None


DDP_TIMES = ("avg_forward_compute_time", "avg_backward_compute_time",
             "avg_backward_comm_time", "avg_backward_compute_comm_overlap_time")


def ddp_averages(ddp: Any) -> dict:
    """DDP's running averages (ns) and how many iterations they are over (`iteration`, the last one
    logged: an iteration is logged by the next one's forward)."""
    data = ddp._get_ddp_logging_data()
    return {k: data.get(k) for k in (*DDP_TIMES, "iteration")}


def ddp_figures(ddp: Any, base: Optional[dict]) -> dict:
    """DDP's own averages in seconds over its logged training steps (`base` taken out)."""
    end = ddp_averages(ddp)
    n_end = end.get("iteration") or 0
    n_base = (base or {}).get("iteration") or 0
    n = n_end - n_base
    out: dict = {"iterations": max(0, n), "preflight_excluded": n_base > 0}
    for k in DDP_TIMES:
        total = (end.get(k) or 0) * n_end - ((base or {}).get(k) or 0) * n_base
        out[k.removeprefix("avg_") + "_s"] = total / n / 1e9 if n > 0 else None
    return out


def _collective(event: dict, cuda: bool) -> bool:
    """Whether a trace event is a torch-recorded collective (never one of our ranges)."""
    name = str(event.get("name", ""))
    if event.get("ph") != "X" or name.startswith(PREFIX):
        return False
    if cuda:
        return event.get("cat") == "kernel" and name.startswith("nccl")
    return name.startswith(("c10d::", "gloo:"))


def _next(times: list[float], t: float) -> float:
    """The first of the sorted `times` at or after `t`; `t` itself when there is none."""
    i = bisect.bisect_left(times, t)
    return times[i] if i < len(times) else t


def trace_figures(path: Path, blocking: bool = False, first: Optional[int] = None) -> dict:
    """A trace's own figures per `ProfilerStep#N` (the `first` ones where given): the median step's
    union of the collectives that start in its phases, and their count by name. `blocking`: a call
    lasts until the calling thread's next operator."""
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

    # CUDA: a kernel belongs to the step that launched it (its launch's correlation id), wherever
    # the GPU ran it; CPU: an op to the step it starts in
    launched = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    colls = sorted((launched.get(e.get("args", {}).get("correlation"), e["ts"]) if cuda
                    else e["ts"], e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                   if _collective(e, cuda) and (cuda or in_phase(e["ts"])))
    if blocking and not cuda:
        # a blocking call's caller waits until its thread runs again: gloo's op ends on its worker
        # thread, the training loop's next operator in the trace starts when it resumed
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
