"""An epoch's timing numbers from its steps and its comm: per-phase statistics, comm time per step,
comm_fraction and exposed comm (docs/timing.md); and the stragglers, who makes the others wait,
found from every rank's comm time per step: telemetry gathers each rank's
`CommStats.per_step_seconds` once per epoch into a `StragglerTally` (`from_waits`), merges the
epochs' and names the rank with `named()`.
"""

from __future__ import annotations

import statistics
from typing import Any, Optional, Sequence

from .comm import CommStats
from .phases import PHASES, StepTimes


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]): the sorted value at round(q/100 * (len-1))."""
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


def sampled(steps: Sequence[StepTimes]) -> tuple[list[StepTimes], float]:
    """The steps whose phases were stamped, and what their sums are scaled by to stand for all
    `steps`: every step's time over theirs (1.0 when every step was sampled; 0.0 with none). A
    phase's total is then its share of the sampled steps' time, of every step's time."""
    phased = [s for s in steps if s.phased]
    if len(phased) == len(steps):
        return phased, 1.0
    own = sum(s.seconds() for s in phased)
    return phased, (sum(s.seconds() for s in steps) / own if own > 0 else 0.0)


def summarise_steps(steps: Sequence[StepTimes],
                    sample: Optional[tuple[list[StepTimes], float]] = None
                    ) -> dict[str, dict[str, float]]:
    """mean/median/p95/total seconds per phase and for the whole step. The step's from every
    step; the phases' medians and p95 from the sampled steps, their totals and means scaled to
    every step (so the phases add up to the step). `sample`: `sampled(steps)`, if made."""
    phased, scale = sample or sampled(steps)
    durs = [s.durations() for s in phased]
    out = {}
    for p in PHASES:
        out[p] = describe([d.get(p, 0.0) for d in durs])
        if len(phased) < len(steps):
            out[p]["total"] *= scale
            out[p]["mean"] = out[p]["total"] / len(steps)
    out["step"] = describe([s.seconds() for s in steps])
    return out


def epoch_timing(steps: Sequence[StepTimes], comm: CommStats) -> dict[str, Any]:
    """Per-phase statistics, comm time per step and the comm share of step time. Comm in flight
    and the step's time from every step; exposed comm and compute, which need a step's compute
    end, from the sampled steps, scaled to every step as the phases are."""
    phased, scale = sample = sampled(steps)
    phases = summarise_steps(steps, sample)
    comm_steps = describe(comm.per_step_seconds(steps))
    exposed_each = comm.per_step_exposed(steps)
    exposed = scale * float(sum(x for x, s in zip(exposed_each, steps) if s.phased))
    step_total = phases["step"]["total"]
    fraction: Optional[float] = None
    exposed_fraction: Optional[float] = None
    if steps and step_total > 0:
        # in-flight comm / step time; clipped because an async collective may run on past the last
        # phase boundary of the step that launched it
        fraction = min(1.0, comm.seconds / step_total)
        exposed_fraction = min(1.0, exposed / step_total)
    return {"phases": phases, "comm_step": comm_steps, "comm_fraction": fraction,
            "exposed_s": exposed if steps else None, "exposed_fraction": exposed_fraction,
            "compute_s": scale * float(sum(s.compute_seconds() for s in phased))
            if steps else None, "sampled": len(phased)}


# The last arriver at a step's collectives waits least: a rank's lead = median over the others of
# (their comm time - its own). Durations on each rank's own clock, so no clock offset enters.
# Lateness is the median lead over *all* steps compared (near zero with nothing injected). A rank
# is named only when every threshold holds (docs/timing.md, "Stragglers, injected and found"):
# steps compared: fewer say nothing
STRAGGLER_MIN_STEPS = 20
# last in at least half the steps ...
STRAGGLER_MIN_SHARE = 0.5
# ... and in 1.5x its chance share 1/n (n=2: 75%)
STRAGGLER_CHANCE_FACTOR = 1.5
STRAGGLER_MIN_LATE_S = 0.5e-3  # its median lead: >= 0.5 ms


class StragglerTally:
    """Per rank: the steps it arrived last at and its lead at every step (`merge` sums epochs: the
    run's finding is made from all its steps)."""

    def __init__(self, world: int):
        self.world = world
        self.last = [0] * world
        self.lead_s: list[list[float]] = [[] for _ in range(world)]
        self.steps = 0

    @classmethod
    def from_waits(cls, waits: Sequence[Sequence[float]]) -> "StragglerTally":
        """`waits[rank][step]`: each rank's comm seconds per step (the same steps on every rank).
        Steps where every rank waited exactly as long (no collective) are skipped."""
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
        """{rank, late_ms, share} of the rank the others wait for, or
        None when no rank is clearly the one (the thresholds above)."""
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
    """An epoch's "stragglers" dict: the slowest and fastest rank by summed step time and `tally`'s
    evidence (docs/timing.md, "Stragglers")."""
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
