"""The alpha-beta cost model, fitted on a bench run: an algorithm's time
is steps * alpha + path_bytes * beta (`ddp_lab.predict.costmodel.cost`),
fitted by least squares weighted 1/time per collective and
implementation (`fit_all`); across nodes only the steps that cross them
cost the cross-node fit (`cross_share`). docs/report.md, "The
alpha-beta model".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Union

from ..predict.costmodel import (ALGORITHMS, SHARD_ALIGN, SYNC_FORMULAS, SYNC_COLLECTIVES, TORCH_MODELLED_AS, cost,
                                 ceil_log2, padded)

#: the algorithms in binomial levels (ranks 2^k apart), ours and gloo's
LEVELLED = {("all_reduce", "tree"), ("reduce", "tree"), ("broadcast", "tree"),
            ("all_reduce", "butterfly"), ("broadcast", "torch")}


def cross_share(collective: str, algorithm: str, n: int, per_node: int) -> float:
    """The share of a call's steps (and bytes) that cross nodes of k =
    `per_node` ranks in rank order: 0 on one node, all for a ring, the
    levels 2^j >= k ranks apart for a levelled algorithm."""
    if n <= per_node:
        return 0.0
    if (collective, algorithm) not in LEVELLED:
        return 1.0
    # 2^j < per_node: j < log2 k
    levels, inside = ceil_log2(n), per_node.bit_length() - 1
    return (levels - inside) / levels


def node_load(algorithm: str, per_node: int) -> int:
    """Messages a node's link carries at once in a step across nodes:
    every rank's for a butterfly, one for the others (a ring crosses a
    boundary once each way, a tree's level sends from one rank)."""
    return per_node if algorithm == "butterfly" else 1


def call_time(collective: str, algorithm: str, nbytes: float, n: int, fit: "Fit",
              per_node: Optional[int] = None, intra: Optional["Fit"] = None) -> float:
    """Seconds one call of `nbytes` costs under `fit`; with `per_node` and `intra`, `fit` prices the
    steps that cross nodes (their bytes times `node_load`) and `intra` the others."""
    # bytes as 1-byte elements (the rounding at most a byte); a sharded
    # call pads to shards of SHARD_ALIGN fp32 elements, as zero1 does
    c = cost(collective, algorithm, padded(collective, round(nbytes), n, 4 * SHARD_ALIGN), n, 1)
    if not (per_node and intra):
        return c.time(fit.alpha_s, fit.beta_s_per_byte)
    share = cross_share(collective, algorithm, n, per_node)
    load = node_load(algorithm, per_node) if share else 1
    return (share * c.time(fit.alpha_s, load * fit.beta_s_per_byte)
            + (1 - share) * c.time(intra.alpha_s, intra.beta_s_per_byte))


@dataclass(frozen=True)
class Fit:
    alpha_s: float  # latency per message
    beta_s_per_byte: float  # seconds per byte (1/bandwidth)
    points: int
    impl: str  # the bench implementation fitted
    algorithm: str  # the algorithm its cost model assumes
    group: str
    n: int  # group size of the fitted points
    rel_rms: float  # root mean square of (model - measured) / measured
    op: str = "all_reduce"  # the collective fitted

    @property
    def bandwidth_GBps(self) -> Optional[float]:
        """1/beta in GB/s; None where beta fitted 0."""
        return 1 / self.beta_s_per_byte / 1e9 if self.beta_s_per_byte > 0 else None

    def as_dict(self) -> dict:
        return {"alpha_us": self.alpha_s * 1e6, "beta_ns_per_byte": self.beta_s_per_byte * 1e9,
                "bandwidth_GBps": self.bandwidth_GBps, "points": self.points, "impl": self.impl,
                "algorithm": self.algorithm, "group": self.group, "n": self.n,
                "rel_rms": self.rel_rms, "op": self.op}


def _solve(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Weighted least squares of t = a*x1 + b*x2 (weights 1/t), with a, b >= 0."""
    def fit1(i):
        num = sum((x[i] * t) / (t * t) for *x, t in rows)
        den = sum((x[i] * x[i]) / (t * t) for *x, t in rows)
        return max(0.0, num / den) if den else 0.0

    ws = [(1 / (row[2] * row[2]), row) for row in rows]
    s11, s12, s22, r1, r2 = (sum(w * v[i] * v[j] for w, v in ws)
                             for i, j in ((0, 0), (0, 1), (1, 1), (0, 2), (1, 2)))
    det = s11 * s22 - s12 * s12
    ab = None if abs(det) < 1e-300 else ((r1 * s22 - r2 * s12) / det, (s11 * r2 - s12 * r1) / det)
    if ab is not None and ab[0] >= 0 and ab[1] >= 0:
        return ab
    return (0.0, fit1(1)) if ab is None or ab[0] < 0 else (fit1(0), 0.0)


def fit_alpha_beta(rows: list[dict], impl: Optional[str] = None,
                   group: Optional[str] = None, op: str = "all_reduce") -> Optional[Fit]:
    """Fit on a bench run's correct `op` rows of one impl (torch first) and group (global first)."""
    ar = [r for r in rows if r.get("op") == op and r.get("correct")
          and r.get("time_median_s", 0) > 0]
    if not ar:
        return None
    impls = {r["impl"] for r in ar}
    impl = impl or next((i for i in ("torch", "ring", "butterfly", "tree", "linear") if i in impls), None)
    groups = [r["group"] for r in ar if r["impl"] == impl]
    # none, or a student's function (bench.impl=[my_file.py:fn]): the cost model knows none of
    # its algorithm
    if not groups or impl not in ALGORITHMS.get(op, ()):
        return None
    group = group or ("global" if "global" in groups else groups[0])
    pts = [r for r in ar if r["impl"] == impl and r["group"] == group]
    if len(pts) < 2:
        return None
    algorithm = TORCH_MODELLED_AS.get(op, "?") if impl == "torch" else impl
    costs = [(cost(op, impl, r["elements"], r["group_size"], r["bytes"] // r["elements"]), r) for r in pts]
    data = [(float(c.steps), float(c.path_bytes), float(r["time_median_s"])) for c, r in costs]
    alpha, beta = _solve(data)
    errs = [((alpha * s + beta * b) - t) / t for s, b, t in data]
    rms = (sum(e * e for e in errs) / len(errs)) ** 0.5
    return Fit(alpha, beta, len(pts), impl, algorithm, group, pts[0]["group_size"], rms, op)


#: one fit, or one per (collective, implementation) as `fit_all` makes
Fits = Union[Fit, Mapping[tuple[str, str], Fit]]


def fit_all(rows: list[dict]) -> dict[tuple[str, str], Fit]:
    """One fit per (collective, implementation) a bench run measured."""
    keys = sorted({(r["op"], r["impl"]) for r in rows
                   if r.get("op") in ("all_reduce", "reduce", "broadcast")})
    fits = {k: fit_alpha_beta(rows, k[1], None, k[0]) for k in keys}
    return {k: f for k, f in fits.items() if f is not None}


def phase_fit(fits: Fits, collective: str, algorithm: str) -> Optional[Fit]:
    """The fit that prices a call of `collective` by `algorithm`: the
    bench's of that pair, else the library all_reduce's (the single-fit
    model: its alpha and beta in this algorithm's steps and bytes)."""
    if isinstance(fits, Fit):
        return fits
    return fits.get((collective, algorithm)) or fits.get(("all_reduce", "torch"))


def predict_comm_s(sync: str, n: int, payload_bytes: float, calls: float, fit: Fits,
                   per_node: Optional[int] = None, intra: Optional[Fits] = None) -> Optional[float]:
    """Seconds of comm per step the sync costs under `fit` (one, or `fit_all`'s); None without a
    model or a fit for one of its calls. Across nodes of `per_node` ranks, `fit` prices what crosses
    them, `intra` the rest. k collectives per bucket (reduce_broadcast: 2): buckets = calls / k,
    each call of payload / calls bytes."""
    phases = SYNC_COLLECTIVES.get(sync)
    if phases is None or payload_bytes is None:
        return None
    if n <= 1 or payload_bytes <= 0:
        return 0.0
    calls = max(1.0, calls or 1.0)
    per_call = payload_bytes / calls
    buckets = max(1.0, calls / len(phases))
    fits = [phase_fit(fit, coll, algo) for coll, algo in phases]
    inside = [phase_fit(intra, coll, algo) if intra else None for coll, algo in phases]
    if any(f is None for f in fits):
        return None
    try:
        return buckets * sum(call_time(coll, algo, per_call, n, f, per_node, i)
                             for (coll, algo), f, i in zip(phases, fits, inside))
    except (KeyError, ValueError):
        # a call the cost model has no answer for: no prediction
        return None


def formula(sync: str) -> str:
    return SYNC_FORMULAS[sync] + " per bucket" if sync in SYNC_FORMULAS else "no model"
