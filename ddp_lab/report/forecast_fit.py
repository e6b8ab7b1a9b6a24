"""The forecast's model of time per epoch, fitted on the measured runs
of a series.

    T(n) = S(n) * (c(b(n)) + m(n))

S: steps per epoch per rank; c: compute per step at b samples per rank
(a line in b where several were measured); m: comm per step from the
alpha-beta model, one fit per link level (a bench run, else the study's
own comm). What each term is fitted on and what the model leaves out:
docs/scaling.md, "Forecast".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from .alpha_beta import Fit, _solve, predict_comm_s
from .run import Run


@dataclass
class Point:
    """One measured run, reduced to what the forecast needs
    (post-warm-up epochs)."""

    sync: str
    world: int
    nodes: int
    batch: float  # samples per rank per step
    steps: float  # steps per epoch per rank
    epoch_s: float
    comm_s: Optional[float]  # measured comm per step
    payload: Optional[float]  # bytes per step
    calls: Optional[float]
    # ranks per CPU core of its node where ranks outnumber cores (CPU
    # runs), else 1
    share: float = 1.0

    @property
    def compute_s(self) -> float:
        """Compute per step as one rank with a core of its own would
        take it."""
        return (self.epoch_s / self.steps - (self.comm_s or 0.0)) / self.share


def measured_point(r: Run, warmup: Optional[int]) -> Optional[Point]:
    times, skip = r.epoch_time_values(warmup)
    recs = sorted((x for x in r.records if x.epoch_time_s and not x.resumed_at_step),
                  key=lambda x: x.epoch)[skip:]
    steps = sum(int(x.steps or 0) for x in recs)
    if not times or not recs or not steps:
        return None
    comm = {k: sum(float((x.comm or {}).get(k) or 0.0) for x in recs) / steps
            for k in ("time_s", "payload_bytes", "calls")}
    world = r.world_size or 1
    batch = (r.global_batch / world) if r.scaling == "strong" and r.global_batch else \
        float(r.summary.get("batch_size") or (r.config.get("train") or {}).get("batch_size") or 0)
    return Point(r.get("sync", "?"), world, int(r.get("nodes") or 1), batch, steps / len(recs),
                 sum(times) / len(times), comm["time_s"] if comm["calls"] else None,
                 comm["payload_bytes"] or None, comm["calls"] or None,
                 core_share(r.device_kind, r.get("nproc_per_node"), r.fingerprint.get("cpu_count")))


def core_share(device: str, ranks_per_node, cores) -> float:
    """How many ranks share one core (>= 1) on a CPU node whose ranks
    outnumber its cores: every rank then runs 1/share of the time, its
    compute and its part of every collective."""
    if device != "cpu" or not ranks_per_node or not cores:
        return 1.0
    return max(1.0, float(ranks_per_node) / float(cores))


def own_fit(points: list[Point]) -> Optional[Fit]:
    """alpha, beta from the measured comm per step of multi-rank points
    (see the module docstring); None without one."""
    rows = []
    for p in points:
        if p.world < 2 or not p.comm_s or not p.payload:
            continue
        x1 = predict_comm_s(p.sync, p.world, p.payload, p.calls, Fit(1.0, 0.0, 0, "", "", "", 0, 0))
        x2 = predict_comm_s(p.sync, p.world, p.payload, p.calls, Fit(0.0, 1.0, 0, "", "", "", 0, 0))
        if x1 is None or x2 is None:
            continue
        rows.append((x1, x2, p.comm_s / p.share))
    if not rows:
        return None
    r0 = rows[0][0] / rows[0][1] if rows[0][1] else None
    if all(x2 and r0 and abs(x1 / x2 - r0) <= 1e-9 * r0 for x1, x2, _ in rows):
        # one world, one sync: every point has the same latency/bytes
        # mix and alpha and beta cannot be told apart; the latency term
        # alone (2(n-1) alpha for a ring) grows with n as the measured
        # comm of small messages on one machine does
        a = sum(x1 / t for x1, _, t in rows) / sum(x1 * x1 / (t * t) for x1, _, t in rows)
        b = 0.0
    else:
        a, b = _solve(rows)
    errs = [((a * x1 + b * x2) - t) / t for x1, x2, t in rows]
    rms = math.sqrt(sum(e * e for e in errs) / len(errs))
    return Fit(a, b, len(rows), "measured", "sync's own", "study", max(p.world for p in points), rms)


def why_no_fit(points: list[Point], max_world: Optional[int] = None) -> str:
    """Why neither a bench nor the runs' own points give a comm fit, as
    the points show it: no multi-rank point (among the worlds up to
    `max_world`, what a held-out check fits on), multi-rank points
    without a comm record, or calls the cost model has no prediction
    for."""
    multi = [p for p in points if p.world >= 2]
    if not multi:
        among = (f" at the fitted world(s) <= {max_world} (the largest world is held out)"
                 if max_world else "")
        return f"no bench run on this backend/device and no multi-rank point{among}"
    timed = [p for p in multi if p.comm_s and p.payload]
    if not timed:
        return ("no bench run on this backend/device, and the multi-rank point(s) recorded no "
                "comm time (timing.enabled=false?)")
    syncs = sorted({p.sync for p in timed})
    return (f"no bench run on this backend/device, and no prediction for the calls of "
            f"sync={', '.join(syncs)} (ddp_lab/predict/costmodel.py) to fit the multi-rank "
            f"point(s) with")


class Model:
    """The fitted model of one series (one sync and workload) on one
    backend and device."""

    def __init__(self, pts: list[Point], scaling: str, cap: int, fit_intra: Optional[Fit],
                 fit_cross: Optional[Fit], gpus_per_node: int, shape: Optional[list[Point]] = None,
                 device: str = "?", cores: Optional[int] = None):
        self.scaling, self.cap, self.G = scaling, cap, gpus_per_node
        self.device, self.cores = device, cores
        self.fit_intra, self.fit_cross = fit_intra, fit_cross or fit_intra
        comp = [(p.batch, p.compute_s) for p in pts]
        bs = {b for b, _ in comp}
        if len(bs) > 1:  # c = c0 + c1 * b, least squares
            mb = sum(b for b, _ in comp) / len(comp)
            mc = sum(c for _, c in comp) / len(comp)
            sxx = sum((b - mb) ** 2 for b, _ in comp)
            self.c1 = sum((b - mb) * (c - mc) for b, c in comp) / sxx
            self.c0 = mc - self.c1 * mb
        else:
            # one batch measured: the largest fitted world's compute (it
            # has the most
            # ranks sharing the machine's memory and cores),
            # proportional to the batch
            top = max(p.world for p in pts)
            cs = [p.compute_s for p in pts if p.world == top]
            b = next(iter(bs))
            self.c0, self.c1 = 0.0, (sum(cs) / len(cs)) / b if b else 0.0
        # the epoch's samples (D), from an uncapped point; None when
        # every point was capped
        uncapped = [p for p in pts if not cap or p.steps < cap]
        self.samples = max(p.steps * p.batch * p.world for p in uncapped) if uncapped else None
        # bytes and calls per step: what the sync sends, not a timing
        # (any run of the series tells them, a held-out one too: a
        # 1-rank run sends nothing)
        multi = [p for p in (shape or pts) if p.payload and p.calls]
        ref = max(multi, key=lambda p: p.world) if multi else None
        self.payload, self.calls = (ref.payload, ref.calls) if ref else (None, None)
        self.sync = pts[0].sync

    def steps(self, n: int, batch: float) -> Optional[float]:
        full = math.ceil(self.samples / (batch * n)) if self.samples else None
        if self.cap:
            return min(self.cap, full) if full else float(self.cap)
        return full

    def comm(self, n: int, nodes: int) -> Optional[float]:
        """Comm per step of n ranks on `nodes` nodes: on one, the
        intra-node fit; across several, the cross-node fit for the steps
        that cross them (all of a ring's: the link paces every step),
        the intra-node one for the others (`model.cross_share`)."""
        if n < 2:
            return 0.0
        if self.fit_intra is None or self.payload is None:
            return None
        if nodes <= 1:
            return predict_comm_s(self.sync, n, self.payload, self.calls, self.fit_intra)
        return predict_comm_s(self.sync, n, self.payload, self.calls, self.fit_cross,
                              per_node=math.ceil(n / nodes), intra=self.fit_intra)

    def predict(self, n: int, batch: float, per_node: Optional[int] = None) -> Optional[dict]:
        """Time per epoch on n ranks (`per_node` of them on a node:
        default min(n, G)) at `batch` samples per rank per step."""
        if batch < 1:
            return None
        per_node = per_node or min(n, self.G)
        s, m = self.steps(n, batch), self.comm(n, math.ceil(n / per_node))
        if s is None or m is None:
            return None
        f = core_share(self.device, per_node, self.cores)
        c = (self.c0 + self.c1 * batch) * f
        m *= f
        return {"epoch_s": s * (c + m), "steps": s, "compute_ms": c * 1e3, "comm_ms": m * 1e3,
                "core_share": f}


def bench_level(bench: list[dict], device: str, backend: str, across: bool,
                fid: Optional[str]) -> Optional[dict]:
    """The bench run (its `comm_tables.bench_fits` entry) that measured
    one link level on this backend and device: across nodes (2 or more)
    or inside one; the allocation `fid`'s own (same fingerprint) where
    there is one, the latest first; None where none did."""
    level = [f for f in bench if f["primary"] and f["run"].get("backend") == backend
             and f["run"].device_kind == device and ((f["run"].get("nodes") or 1) > 1) == across]
    mine = [f for f in level if fid and f["run"].fingerprint_id == fid]
    return (mine or level)[-1] if level else None


OWN_FIT = "fitted on the study's own comm per step"


def _level_fit(found: Optional[dict], pts: list[Point]) -> tuple[Optional[Fit], str]:
    """One level's fit and its source: the bench run that measured it,
    else its points'."""
    if found:
        return found["primary"], "bench: " + found["run"].path.name
    return own_fit(pts), OWN_FIT


def comm_fits(bench: list[dict], pool_pts: list[Point], device: str, backend: str,
              fid: Optional[str] = None) -> tuple[Optional[Fit], Optional[Fit], str]:
    """(intra-node fit, cross-node fit, where they came from): per level
    the bench's, else the study's own points' of that level (see the
    module docstring)."""
    one, many = (bench_level(bench, device, backend, across, fid) for across in (False, True))
    intra, intra_src = _level_fit(one, [p for p in pool_pts if p.nodes == 1])
    cross, cross_src = _level_fit(many, [p for p in pool_pts if p.nodes > 1])
    # no point of one node: the other level's fit, else every point's
    if intra is None:
        intra, intra_src = (cross, cross_src) if cross else (own_fit(pool_pts), OWN_FIT)
    # nothing crossed a node: the intra-node fit for every link
    if cross is None:
        return intra, intra, intra_src
    if intra_src == cross_src:
        return intra, cross, intra_src
    return intra, cross, f"{intra_src} (intra-node), {cross_src} (cross-node)"


def fit_model(runs: list[Run], pool: list[Run], scaling: str, cap: int, bench: list[dict],
              G: int, warmup: Optional[int], max_world: Optional[int] = None,
              fid: Optional[str] = None) -> tuple[Optional[Model], str]:
    """Fit a series' model on its runs (and the comm fit on `pool`),
    worlds <= max_world; comm fits of the allocation `fid` where a bench
    measured it."""
    keep = (lambda r: (r.world_size or 1) <= max_world) if max_world else (lambda r: True)
    every = [p for p in (measured_point(r, warmup) for r in runs) if p]
    pts = [p for p in every if not max_world or p.world <= max_world]
    if not pts:
        return None, "no measured point"
    first = runs[0]
    pool_pts = [p for p in (measured_point(r, warmup) for r in pool if keep(r)) if p]
    intra, cross, src = comm_fits(bench, pool_pts, first.device_kind, first.get("backend"), fid)
    if intra is None:
        return None, "no comm fit: " + why_no_fit(pool_pts, max_world)
    cores = next((r.fingerprint.get("cpu_count") for r in runs if r.fingerprint.get("cpu_count")), None)
    return Model(pts, scaling, cap, intra, cross, G, shape=every, device=first.device_kind,
                 cores=cores), src
