"""`timing.profile=true`: torch.profiler over a few steps on every rank,
and the witnesses that check ddp_lab's own figures against clocks not
its own (docs/timing.md, "Independent witnesses": what each figure means
and how far they should agree).

`StepProfiler` traces `timing.profile_steps` steps after
`timing.profile_skip` into `profile/rank<N>.pt.trace.json`, labelling
the phases and blocking collectives (`ddp_lab:<name>`, NVTX on CUDA) by
wrapping the timer's `phase` and the recorder's `timed` for the window
only. Witnesses read the trace's own collectives, never our ranges.
"""

from __future__ import annotations

import logging
import os
import statistics
from pathlib import Path
from typing import Any, Optional

import torch

from ..config import TimingConfig
from ..timing import CommStats, StepTimes
from .witnesses import PREFIX, ddp_averages, ddp_of, ddp_figures, trace_figures

log = logging.getLogger("ddp_lab")

# Kineto (torch.profiler's C++ side) prints to the rank's stderr at or
# above its level: by default ERROR (4), and USDT (5) lines on every
# start and stop. A CUDA build on a machine without a driver adds
# `ERROR: ... gpuGetDeviceCount failed with code 35` as it writes the
# trace's device properties, on a healthy CPU run. 6 is above its
# highest level: none of its lines. Read once, when the profiler first
# starts in the process; a user's own KINETO_LOG_LEVEL wins (0:
# everything, docs/timing.md).
KINETO_QUIET = "6"


class _Range:
    """One labelled phase or call: a `record_function` range (and on
    CUDA an NVTX range) around the timer's own context."""

    __slots__ = ("name", "inner", "nvtx", "rf")

    def __init__(self, name: str, inner: Any, nvtx: bool):
        self.name, self.inner, self.nvtx, self.rf = name, inner, nvtx, None

    def __enter__(self) -> None:
        self.rf = torch.profiler.record_function(self.name)
        self.rf.__enter__()
        if self.nvtx:
            torch.cuda.nvtx.range_push(self.name)
        self.inner.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.inner.__exit__(*exc)
        if self.nvtx:
            torch.cuda.nvtx.range_pop()
        self.rf.__exit__(*exc)


class StepProfiler:
    """torch.profiler over a window of steps, the phases labelled; see
    the module docstring."""

    def __init__(self, timing: TimingConfig, rank: int, device: torch.device, run_dir: Path,
                 timer: Any, syncer: Any):
        self.skip, self.active = int(timing.profile_skip), int(timing.profile_steps)
        self.rank, self.timer, self.comm = rank, timer, syncer.comm
        self.path = run_dir / "profile" / f"rank{rank}.pt.trace.json"
        self.cuda = device.type == "cuda"
        # sync=ddp in a world > 1: DDP's own timing too
        self.ddp = ddp_of(syncer.wrapped)
        # the caller waits for each collective (every sync but ddp and
        # sync.overlap)
        self.blocking = self.ddp is None and not getattr(syncer, "overlapped", False)
        # every iteration from now (the preflight's is iteration 1)
        if self.ddp is not None:
            self.ddp._set_ddp_runtime_logging_sample_rate(1)
        # DDP's averages after the preflight alone
        self.ddp_base: Optional[dict] = None
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        # the profiler's own warm-up step, within the skip
        warmup = 1 if self.skip > 0 else 0
        # before Kineto initialises
        os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET)
        self.prof = torch.profiler.profile(
            activities=activities, on_trace_ready=self._write,
            schedule=torch.profiler.schedule(wait=self.skip - warmup, warmup=warmup,
                                             active=self.active, repeat=1))
        # steps ended since the profiler started
        self.steps = 0
        # ddp_lab's figures for the window's steps
        self.ours: Optional[dict] = None
        self.run_steps, self.run_inflight, self.run_exposed, self.run_compute = 0, 0.0, 0.0, 0.0
        self.written = False
        self._attach()
        self.prof.start()

    # ------------------------------------------------------------ the window
    def _attach(self) -> None:
        """Wrap the timer's `phase`, the recorder's `timed` and the step
        end, on these two objects only (instance attributes over the
        class's methods; `_detach` removes them)."""
        timer, comm, nvtx = self.timer, self.comm, self.cuda
        phase, timed, step_end = timer.phase, comm.timed, timer.on_step_end
        ranges: dict[str, _Range] = {}

        def labelled_phase(name: str) -> _Range:
            r = ranges.get(name)
            if r is None:
                r = ranges[name] = _Range(PREFIX + name, None, nvtx)
            r.inner = phase(name)
            return r

        def labelled_call(op: str, *args: Any, **kw: Any) -> _Range:
            return _Range(PREFIX + op, timed(op, *args, **kw), nvtx)

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
        # the preflight's figures were logged
        if self.steps == 1 and self.ddp is not None:
            # by this step's forward: iteration 1
            self.ddp_base = ddp_averages(self.ddp)
        self.prof.step()
        if self.steps >= self.skip + self.active:
            self.stop()

    def stop(self) -> None:
        """End the window (its trace is written) and unwrap;
        idempotent."""
        if self.prof is not None:
            self._detach()
            self.prof.stop()
            self.prof = None

    def _write(self, prof: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        prof.export_chrome_trace(str(tmp))
        # atomic: a reader never sees half a trace
        tmp.replace(self.path)
        self.written = True

    # ------------------------------------------------------------ the figures
    def measured(self, steps: list[StepTimes], comm: CommStats) -> None:
        """Each epoch's steps and calls (EpochControl.end): the first
        epoch's give ddp_lab's figures for the window (ended here at the
        latest); every epoch adds to this rank's sums."""
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
            # medians: one step a busy machine preempted mid-call moves
            # a mean, not these
            "comm_per_step_s": statistics.median(inflight[i] for i in window),
            "exposed_per_step_s": statistics.median(exposed[i] for i in window),
            "compute_per_step_s": sum(steps[i].compute_seconds() for i in window) / n,
            "step_s": sum(steps[i].end - steps[i].start for i in window) / n,
            "calls": len(calls),
            "call_s": sum(c.end - c.start for c in calls) / len(calls) if calls else None,
        }

    def ddp_timing(self) -> Optional[dict]:
        """DDP's averages over the training steps (the preflight's
        iteration taken out) beside ddp_lab's over all the steps of the
        run, this rank; None without DDP."""
        if self.ddp is None:
            return None
        n = self.run_steps
        return {**ddp_figures(self.ddp, self.ddp_base), "every_iteration": True,
                "ddp_lab": {"comm_per_step_s": self.run_inflight / n if n else None,
                            "hidden_per_step_s": (self.run_inflight - self.run_exposed) / n
                            if n else None,
                            "compute_per_step_s": self.run_compute / n if n else None,
                            "steps": n}}

    def witnesses(self, ctx: Any) -> Optional[dict]:
        """Collective. Every rank's figures for the window and its
        trace's, on the logging rank (None on the others): what
        summary.json keeps as `witnesses`."""
        self.stop()
        mine = {"rank": self.rank, "ddp_lab": self.ours or {},
                # the steps ddp_lab timed: where the first epoch ended
                # inside the window, the profiler's last step is the
                # rest of the epoch (evaluation), no step
                "profiler": trace_figures(self.path, self.blocking, (self.ours or {}).get("steps"))
                if self.written else {},
                "trace": f"profile/{self.path.name}" if self.written else None}
        ranks = ctx.gather_objects_to(mine, dst=0)
        if ranks is None or not ctx.env.is_main:
            return None
        return {"window": {"skip": self.skip, "steps": self.active},
                "device": "cuda" if self.cuda else "cpu", "ranks": ranks}


def make_profiler(timing: TimingConfig, rank: int, device: torch.device,
                  run_dir: Optional[Path], timer: Any, syncer: Any) -> Optional[StepProfiler]:
    """The run's profiler when `timing.profile` is on (and there is a
    run folder), else None."""
    if not getattr(timing, "profile", False) or run_dir is None:
        return None
    return StepProfiler(timing, rank, device, run_dir, timer, syncer)

