"""One epoch as this rank measured it (`MeasuredEpoch`) and where a run stands
(`Position`): what the training loop hands to `Telemetry.epoch` (records) and to the
`Checkpointer` (a graceful stop's checkpoint), in a module both import, so that neither
imports the other."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..timing import CommStats, StepTimes


@dataclass
class Position:
    """Where a run stands: epochs done, steps done of the next epoch, and that partial
    epoch's sums so far (carried through a mid-epoch checkpoint)."""

    epoch: int = 0
    step: int = 0
    loss_sum: float = 0.0
    samples: int = 0
    busy_s: float = 0.0
    wall_s: float = 0.0


@dataclass
class MeasuredEpoch:
    """One epoch as this rank measured it, handed whole to `Telemetry.epoch` (and, when the
    ranks stopped inside it, to `Checkpointer.on_stop`). `epoch` is 1-based: the epochs
    done when it ends. An epoch resumed mid-way (`resumed_at_step` > 0) was run by two
    allocations: the fields are this one's part, `carried` the part the checkpoint held
    (`Checkpointer.carried`: its global loss and sample sums on rank 0 only, its times on
    every rank); `totals` adds the two."""

    epoch: int
    steps: list[StepTimes]  # this part's phase stamps (none when timing is off)
    comm: CommStats  # this part's collectives
    busy_s: float  # this rank's own time, before waiting for the others at the epoch's end
    wall_s: float  # barrier to barrier: the slowest rank's time
    loss_sum: float  # this rank's training loss summed over its samples
    samples: int
    resumed_at_step: int = 0
    carried: Position = field(default_factory=Position)
    test: tuple[float, float] = (float("nan"), float("nan"))  # (loss, accuracy), after the steps

    def totals(self) -> tuple[float, int, float, float]:
        """The whole epoch on this rank: (loss sum, samples, busy s, wall s)."""
        c = self.carried
        return (c.loss_sum + self.loss_sum, c.samples + self.samples, c.busy_s + self.busy_s,
                c.wall_s + self.wall_s)
