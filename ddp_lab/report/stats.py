"""Statistics of repeats: mean, standard deviation, 95% confidence intervals.

A point of a scaling study (one config, one world size, one allocation fingerprint) is
measured by n repeats, each giving one value (its mean post-warm-up epoch time). The
point's interval is Student's t: mean +- t(0.975, n-1) * s / sqrt(n), s the sample standard
deviation (n-1 in the denominator); one repeat has no interval.

A speedup is a ratio of two such means, T_base / T. Its interval comes from the delta
method: the ratio's relative variance is the sum of the two means' relative variances,
(s0^2 / (n0 m0^2)) + (s1^2 / (n1 m1^2)), with Welch-Satterthwaite's degrees of freedom
for the t quantile. Efficiency = speedup x base world / world, its interval scaled alike.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

from scipy import stats as _st

LEVEL = 0.95


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    std: Optional[float]  # sample standard deviation; None for one value
    ci95: Optional[tuple[float, float]]  # None for one value

    def as_dict(self) -> dict:
        return {"n": self.n, "mean": self.mean, "std": self.std,
                "ci95": list(self.ci95) if self.ci95 else None}


def t_quantile(df: float) -> float:
    """Student's t at (1 + LEVEL) / 2 with `df` degrees of freedom."""
    return float(_st.t.ppf((1 + LEVEL) / 2, df))


def summarize(values: Sequence[float]) -> Optional[Summary]:
    values = [float(v) for v in values if v is not None]
    if not values:
        return None
    n, mean = len(values), statistics.fmean(values)
    if n < 2:
        return Summary(n, mean, None, None)
    std = statistics.stdev(values)
    half = t_quantile(n - 1) * std / math.sqrt(n)
    return Summary(n, mean, std, (mean - half, mean + half))


def ratio(num: Summary, den: Summary) -> tuple[float, Optional[tuple[float, float]]]:
    """num.mean / den.mean and its 95% interval (delta method, Welch's df); no interval
    when either side has a single value (its spread is unknown)."""
    r = num.mean / den.mean
    if num.std is None or den.std is None:
        return r, None
    a = (num.std / num.mean) ** 2 / num.n
    b = (den.std / den.mean) ** 2 / den.n
    if a + b == 0:
        return r, (r, r)
    df = (a + b) ** 2 / (a * a / (num.n - 1) + b * b / (den.n - 1))
    half = t_quantile(df) * r * math.sqrt(a + b)
    return r, (r - half, r + half)
