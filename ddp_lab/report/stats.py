"""Statistics of repeats: mean, standard deviation, 95% confidence
intervals.

A point's interval is Student's t on the logs of its repeats,
exponentiated (times are positive and their spread relative); fewer than
MIN_REPEATS values give none. A speedup's interval comes from the delta
method on the log of the ratio (docs/scaling.md, "Reading a scaling
report").
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence


LEVEL = 0.95
# the fewest values an interval is given for
MIN_REPEATS = 3


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float  # arithmetic mean
    # sample standard deviation; None for one value
    std: Optional[float]
    # None below MIN_REPEATS values
    ci95: Optional[tuple[float, float]]

    def as_dict(self) -> dict:
        return {"n": self.n, "mean": self.mean, "std": self.std,
                "ci95": list(self.ci95) if self.ci95 else None}


def t_quantile(df: float) -> float:
    """Student's t at (1 + LEVEL) / 2 with `df` degrees of freedom."""
    # lazy: scipy.stats takes about 1.2 s to load, and only intervals
    # (3+ repeats) need it
    from scipy import stats

    return float(stats.t.ppf((1 + LEVEL) / 2, df))


def summarize(values: Sequence[float]) -> Optional[Summary]:
    """n, mean, std and the log-scale 95% interval of positive values
    (see above)."""
    values = [float(v) for v in values if v is not None]
    if not values:
        return None
    n, mean = len(values), statistics.fmean(values)
    if n < 2:
        return Summary(n, mean, None, None)
    std = statistics.stdev(values)
    if n < MIN_REPEATS or min(values) <= 0:
        return Summary(n, mean, std, None)
    logs = [math.log(v) for v in values]
    centre, half = statistics.fmean(logs), t_quantile(n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return Summary(n, mean, std, (math.exp(centre - half), math.exp(centre + half)))


def ratio(num: Summary, den: Summary) -> tuple[float, Optional[tuple[float, float]]]:
    """num.mean / den.mean and its 95% interval (delta method on the log
    ratio, Welch's df); no interval when either side has fewer than
    MIN_REPEATS values."""
    r = num.mean / den.mean
    if num.ci95 is None or den.ci95 is None:
        return r, None
    a = (num.std / num.mean) ** 2 / num.n
    b = (den.std / den.mean) ** 2 / den.n
    if a + b == 0:
        return r, (r, r)
    df = (a + b) ** 2 / (a * a / (num.n - 1) + b * b / (den.n - 1))
    half = t_quantile(df) * math.sqrt(a + b)
    return r, (r * math.exp(-half), r * math.exp(half))


def sig(v: Optional[float], none: str = "–") -> str:
    """v to 3 significant digits, never in exponent form: 0.0123, 1.23,
    12.3, 1234."""
    if v is None:
        return none
    if v == 0 or not math.isfinite(v):
        return format(v, "g")
    return f"{v:.{max(0, 2 - math.floor(math.log10(abs(v))))}f}"
