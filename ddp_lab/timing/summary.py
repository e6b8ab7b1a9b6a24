"""An epoch's timing numbers from its steps and its comm: per-phase
statistics, comm time per step, comm_fraction and exposed comm
(docs/timing.md).
"""

from __future__ import annotations

import statistics
from typing import Any, Optional, Sequence

from .comm import CommStats
from .phases import PHASES, StepTimes


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]): the sorted value at
    round(q/100 * (len-1))."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q}: must be in [0, 100]")
    s = sorted(values)
    return s[int(round(q / 100 * (len(s) - 1)))]


def describe(values: Sequence[float]) -> dict[str, float]:
    """mean, median, p95 and total of a list of seconds (zeros for an
    empty list)."""
    if not values:
        return {"mean": 0.0, "median": 0.0, "p95": 0.0, "total": 0.0}
    return {"mean": statistics.fmean(values), "median": statistics.median(values),
            "p95": percentile(values, 95), "total": float(sum(values))}


def summarise_steps(steps: Sequence[StepTimes]) -> dict[str, dict[str, float]]:
    """mean/median/p95/total seconds per phase and for the whole
    step."""
    durs = [s.durations() for s in steps]
    out = {p: describe([d.get(p, 0.0) for d in durs]) for p in PHASES}
    out["step"] = describe([sum(d.values()) for d in durs])
    return out


def epoch_timing(steps: Sequence[StepTimes], comm: CommStats) -> dict[str, Any]:
    """Per-phase statistics, comm time per step and the comm share of
    step time."""
    phases = summarise_steps(steps)
    comm_steps = describe(comm.per_step_seconds(steps))
    exposed = float(sum(comm.per_step_exposed(steps)))
    step_total = phases["step"]["total"]
    fraction: Optional[float] = None
    exposed_fraction: Optional[float] = None
    if steps and step_total > 0:
        # in-flight comm / step time; clipped because an async
        # collective may run on past the last phase boundary of the step
        # that launched it
        fraction = min(1.0, comm.seconds / step_total)
        exposed_fraction = min(1.0, exposed / step_total)
    return {"phases": phases, "comm_step": comm_steps, "comm_fraction": fraction,
            "exposed_s": exposed if steps else None, "exposed_fraction": exposed_fraction,
            "compute_s": float(sum(s.compute_seconds() for s in steps)) if steps else None}
