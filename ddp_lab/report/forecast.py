"""Forecast time per epoch for worlds nobody ran. The honest check: per
series, fit on every world but the largest and predict it; a forecast
is shown only with that error, reliable only within TARGET (`verdict`;
docs/scaling.md, "Forecast").
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional

from ..world.fingerprint import link_label
from .alpha_beta import _solve, Fit, predict_comm_s
from .run import Run, usable
from .tables import md_row, sig


@dataclass
class Point:
    """One measured run's post-warm-up epochs, as the forecast needs it."""

    sync: str
    world: int
    nodes: int
    batch: float  # samples per rank per step
    steps: float  # steps per epoch per rank
    epoch_s: float
    comm_s: Optional[float]  # measured comm per step
    payload: Optional[float]  # bytes per step
    calls: Optional[float]
    # ranks per CPU core of its node where they outnumber cores, else 1
    share: float = 1.0

    @property
    def compute_s(self) -> float:
        """Compute per step of one rank with a core of its own."""
        return (self.epoch_s / self.steps - (self.comm_s or 0.0)) / self.share


def measured_point(r: Run, warmup: Optional[int]) -> Optional[Point]:
    times, skip = r.epoch_time_values(warmup)
    recs = r.timed_records()[skip:]
    steps = r.steps_total(recs)
    if not times or not recs or not steps:
        return None
    comm = r.comm_per_step(recs)
    return Point(r.get("sync", "?"), r.world_size or 1, int(r.get("nodes") or 1),
                 r.batch_per_rank or 0.0, steps / len(recs),
                 sum(times) / len(times), comm["time_s"] if comm["calls"] else None,
                 comm["payload_bytes"] or None, comm["calls"] or None,
                 core_share(r.device_kind, r.get("nproc_per_node"), r.fingerprint.get("cpu_count")))


def core_share(device: str, ranks_per_node, cores) -> float:
    """How many ranks share one core (>= 1) on a CPU node: each then runs
    1/share of the time, its compute and its collectives alike."""
    if device != "cpu" or not ranks_per_node or not cores:
        return 1.0
    return max(1.0, float(ranks_per_node) / float(cores))


def own_fit(points: list[Point]) -> Optional[Fit]:
    """alpha, beta from the multi-rank points' measured comm per step."""
    rows = []
    for p in (p for p in points if p.world >= 2 and p.comm_s and p.payload):
        # the model's alpha term and beta term: its time under alpha = 1, beta = 0 and the reverse
        x1, x2 = (predict_comm_s(p.sync, p.world, p.payload, p.calls, Fit(a, 1 - a, 0, "", "", "", 0, 0))
                  for a in (1.0, 0.0))
        if x1 is not None and x2 is not None:
            rows.append((x1, x2, p.comm_s / p.share))
    if not rows:
        return None
    r0 = rows[0][0] / rows[0][1] if rows[0][1] else None
    if all(x2 and r0 and abs(x1 / x2 - r0) <= 1e-9 * r0 for x1, x2, _ in rows):
        # one world, one sync: one latency/bytes mix, alpha and beta not told apart; the latency
        # term alone (2(n-1) alpha for a ring) grows with n as small messages on one machine do
        a = sum(x1 / t for x1, _, t in rows) / sum(x1 * x1 / (t * t) for x1, _, t in rows)
        b = 0.0
    else:
        a, b = _solve(rows)
    errs = [((a * x1 + b * x2) - t) / t for x1, x2, t in rows]
    rms = math.sqrt(sum(e * e for e in errs) / len(errs))
    return Fit(a, b, len(rows), "measured", "sync's own", "study", max(p.world for p in points), rms)


def why_no_fit(points: list[Point], max_world: Optional[int] = None) -> str:
    """Why neither a bench nor the points (worlds up to `max_world`) give a comm fit."""
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
    """The fitted model of one series (one sync and workload) on one backend and device."""

    def __init__(self, pts: list[Point], cap: int, fit_intra: Optional[Fit], fit_cross: Optional[Fit],
                 gpus_per_node: int, shape: list[Point], device: str, cores: Optional[int]):
        self.cap, self.G, self.device, self.cores = cap, gpus_per_node, device, cores
        self.fit_intra, self.fit_cross = fit_intra, fit_cross or fit_intra
        bs = {p.batch for p in pts}
        if len(bs) > 1:  # c = c0 + c1 * b, least squares
            self.c1, self.c0 = statistics.linear_regression([p.batch for p in pts],
                                                            [p.compute_s for p in pts])
        else:
            # one batch measured: the largest fitted world's compute (the
            # most ranks sharing memory and cores), proportional to it
            top = max(p.world for p in pts)
            cs = [p.compute_s for p in pts if p.world == top]
            b = next(iter(bs))
            self.c0, self.c1 = 0.0, (sum(cs) / len(cs)) / b if b else 0.0
        # the epoch's samples, from an uncapped point (None: all capped)
        uncapped = [p for p in pts if not cap or p.steps < cap]
        self.samples = max(p.steps * p.batch * p.world for p in uncapped) if uncapped else None
        # bytes and calls per step: what the sync sends, not a timing (a
        # held-out run tells them too; a 1-rank run sends nothing)
        multi = [p for p in shape if p.payload and p.calls]
        ref = max(multi, key=lambda p: p.world) if multi else None
        self.payload, self.calls = (ref.payload, ref.calls) if ref else (None, None)
        self.sync = pts[0].sync

    def steps(self, n: int, batch: float) -> Optional[float]:
        full = math.ceil(self.samples / (batch * n)) if self.samples else None
        if self.cap:
            return min(self.cap, full) if full else float(self.cap)
        return full

    def comm(self, n: int, nodes: int) -> Optional[float]:
        """Comm per step of n ranks on `nodes` nodes: the cross-node fit for the steps that cross
        them (`alpha_beta.cross_share`), the intra-node one for the others."""
        if n < 2:
            return 0.0
        if self.fit_intra is None or self.payload is None:
            return None
        if nodes <= 1:
            return predict_comm_s(self.sync, n, self.payload, self.calls, self.fit_intra)
        return predict_comm_s(self.sync, n, self.payload, self.calls, self.fit_cross,
                              per_node=math.ceil(n / nodes), intra=self.fit_intra)

    def predict(self, n: int, batch: float, per_node: Optional[int] = None) -> Optional[dict]:
        """Time per epoch on n ranks (`per_node` a node, default min(n, G)) at `batch` per rank."""
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


OWN_FIT = "fitted on the study's own comm per step"


def comm_fits(bench: list[dict], pool_pts: list[Point], device: str, backend: str,
              fid: str) -> tuple[Optional[Fit], Optional[Fit], str]:
    """(intra-node fit, cross-node fit, their source): per link level the latest
    `tables.bench_fits` entry on this backend and device (`fid`'s own first), else the
    study's own points' of that level."""

    def level_fit(across: bool) -> tuple[Optional[Fit], str]:
        level = [f for f in bench if f["primary"] and f["run"].get("backend") == backend
                 and f["run"].device_kind == device
                 and ((f["run"].get("nodes") or 1) > 1) == across]
        mine = [f for f in level if fid and f["run"].fingerprint_id == fid]
        if level:
            found = (mine or level)[-1]
            return found["primary"], "bench: " + found["run"].path.name
        return own_fit([p for p in pool_pts if (p.nodes > 1) == across]), OWN_FIT

    (intra, intra_src), (cross, cross_src) = level_fit(False), level_fit(True)
    # no point of one node: the other level's fit, else every point's
    if intra is None:
        intra, intra_src = (cross, cross_src) if cross else (own_fit(pool_pts), OWN_FIT)
    # nothing crossed a node: the intra-node fit for every link
    if cross is None:
        return intra, intra, intra_src
    if intra_src == cross_src:
        return intra, cross, intra_src
    return intra, cross, f"{intra_src} (intra-node), {cross_src} (cross-node)"


def fit_model(runs: list[Run], pool: list[Run], cap: int, bench: list[dict], G: int,
              warmup: Optional[int], max_world: Optional[int], fid: str) -> tuple[Optional[Model], str]:
    """Fit a series' model on its runs (the comm on `pool`'s) of worlds
    <= max_world; the comm fits of the allocation `fid` where measured."""
    every = [p for p in (measured_point(r, warmup) for r in runs) if p]
    pts = [p for p in every if not max_world or p.world <= max_world]
    if not pts:
        return None, "no measured point"
    first = runs[0]
    pool_pts = [p for p in (measured_point(r, warmup) for r in pool)
                if p and (not max_world or p.world <= max_world)]
    intra, cross, src = comm_fits(bench, pool_pts, first.device_kind, first.get("backend"), fid)
    if intra is None:
        return None, "no comm fit: " + why_no_fit(pool_pts, max_world)
    cores = next((r.fingerprint.get("cpu_count") for r in runs if r.fingerprint.get("cpu_count")), None)
    return Model(pts, cap, intra, cross, G, every, first.device_kind, cores), src


DEFAULT_WORLDS = [8, 16, 32, 64, 128, 256, 512, 1024]
# the forecast's goal: within 25% of a measured time (docs/scaling.md)
TARGET = 0.25


def forecast(groups: list[dict], runs: list[Run], bench: list[dict],
             worlds: list[int], gpus_per_node: int, warmup: Optional[int] = None) -> dict:
    """Per scaling series: the held-out check and the forecast for `worlds`."""
    by_path = {str(r.path): r for r in runs}
    out = []
    for g in groups:
        members = [by_path[p] for row in g["rows"] for p in row["runs"] if p in by_path]
        if not members:
            continue
        first = members[0]
        pool = [r for r in usable(runs) if r.device_kind == first.device_kind
                and r.get("backend") == first.get("backend")]
        cap = int(first.cfg("train").get("max_steps_per_epoch") or 0)
        entry = {"sync": g["sync"], "device": g["device"], "workload": g["workload"],
                 "workload_short": g.get("workload_short", g["workload"]),
                 "scaling": first.scaling, "gpus_per_node": gpus_per_node, "heldout": None}

        def fit(fid: str, max_world: Optional[int] = None):
            return fit_model(members, pool, cap, bench, gpus_per_node, warmup, max_world, fid)

        def predict(m: Optional[Model], r: Optional[Run], world: int) -> Optional[dict]:
            p = measured_point(r, warmup) if r else None
            return m.predict(world, p.batch, r.get("nproc_per_node")) if m and p else None

        # honest check: fit on the smaller worlds, predict the largest
        # (on the smallest world's first allocation where it ran there)
        measured = sorted({row["world_size"] for row in g["rows"]})
        base_fid = g["rows"][0]["fingerprint_id"]
        if len(measured) >= 2:
            top = measured[-1]
            m, src = fit(base_fid, measured[-2])
            tops = [x for x in g["rows"] if x["world_size"] == top]
            row = next((x for x in tops if x["fingerprint_id"] == base_fid), tops[0])
            pred, t = predict(m, by_path[row["run"]], top), row["epoch_time_s_mean"]
            entry["heldout"] = {"fitted_worlds": measured[:-1], "predicted_world": top, "measured_s": t,
                                "comm_fit": src, "predicted_s": pred["epoch_s"] if pred else None,
                                "rel_error": (pred["epoch_s"] - t) / t if pred else None,
                                "why_not": None if pred else src}
        models = {base_fid: fit(base_fid)}
        m, entry["comm_fit"] = models[base_fid]
        out.append(entry)
        if m is None:
            entry.update(predictions=[], fit=None, fit_check=[])
            entry.update(verdict(entry))
            continue

        # the fitted model against the very points it was fitted on, each
        # with the comm fits of its own allocation (two link rates: two)
        entry["fit_check"] = []
        for row in g["rows"]:
            fid = row["fingerprint_id"]
            if fid not in models:
                models[fid] = fit(fid)
            m_row, src_row = models[fid]
            r = by_path.get(row["runs"][0])
            pred = predict(m_row, r, row["world_size"])
            if pred:
                t = row["epoch_time_s_mean"]
                entry["fit_check"].append({"world": row["world_size"], "measured_s": t,
                                           "predicted_s": pred["epoch_s"],
                                           "rel_error": (pred["epoch_s"] - t) / t,
                                           "fingerprint_id": fid, "comm_fit": src_row,
                                           "link": link_label(r.fingerprint.get("link"))})
        entry["fit"] = {"intra": m.fit_intra.as_dict() if m.fit_intra else None,
                        "cross": m.fit_cross.as_dict() if m.fit_cross else None,
                        "compute_ms_c0": m.c0 * 1e3, "compute_ms_per_sample": m.c1 * 1e3,
                        "epoch_samples": m.samples, "step_cap": cap or None,
                        "payload_bytes_per_step": m.payload, "calls_per_step": m.calls}
        base = min(members, key=lambda r: r.world_size or 1)
        bp = measured_point(base, warmup)
        weak_b = bp.batch if first.scaling == "weak" else (first.global_batch or 0) / (base.world_size or 1)
        strong_g = first.global_batch if first.scaling == "strong" else bp.batch * (base.world_size or 1)
        none = dict.fromkeys(("epoch_s", "steps", "compute_ms", "comm_ms"))
        entry["predictions"] = [{"world": n, "nodes": math.ceil(n / gpus_per_node), "mode": mode,
                                 "batch_per_rank": b, "global_batch": b * n, **(m.predict(n, b) or none)}
                                for n in worlds for mode, b in (("weak", weak_b), ("strong", strong_g / n))]
        entry.update(verdict(entry))
    return {"worlds": worlds, "gpus_per_node": gpus_per_node, "series": out,
            "assumptions": ASSUMPTIONS, "target": TARGET}


def verdict(entry: dict) -> dict:
    """Whether a series' forecast may be shown (only with a held-out error), and `reliable` (that
    error and the fitted model's misses of its measured points all within TARGET), in words."""
    h, fits = entry["heldout"], entry.get("fit_check") or []
    if not entry["predictions"]:
        return {"shown": False, "reliable": False, "why": f"no model: {entry['comm_fit']}"}
    if not h or h["rel_error"] is None:
        why = h["why_not"] if h else "one world size measured"
        hint = ("; a bench run (python -m ddp_lab.bench) given with the runs, or a third world "
                "size, makes one" if "no comm fit" in why else
                "; a run at a second world size (launcher.nproc_per_node) makes one" if not h else "")
        return {"shown": False, "reliable": False,
                "why": f"no held-out check ({why}), so its error is unknown{hint}"}
    misses = [f for f in fits if abs(f["rel_error"]) > TARGET]
    if abs(h["rel_error"]) > TARGET:
        why = f"held-out world {h['predicted_world']} off by {h['rel_error']:+.0%} (target ±{TARGET:.0%})"
    elif misses:
        worst = max(misses, key=lambda f: abs(f["rel_error"]))
        why = (f"the fitted model is off by {worst['rel_error']:+.0%} at measured world "
               f"{worst['world']} (target ±{TARGET:.0%})")
    else:
        return {"shown": True, "reliable": True,
                "why": f"held-out error {h['rel_error']:+.0%} (target ±{TARGET:.0%})"}
    return {"shown": True, "reliable": False, "why": why}


ASSUMPTIONS = [
    "T(n) = S(n) x (compute per step + comm per step); S(n) = the step cap, else the epoch's "
    "samples / (batch per rank x n)",
    "compute per step = measured T / S - measured comm per step (so the epoch's own overhead "
    "rides on it); a line in the batch per rank where several were measured, else the largest "
    "fitted world's, proportional to the batch per rank",
    "comm per step = the sync's alpha-beta cost (payload and calls per step as recorded); "
    "one alpha-beta fit per link level: intra-node for ranks of one node, cross-node for ranks "
    "on several (a measured point's nodes, else nodes of --gpus-per-node ranks); each from the "
    "bench run of that level (the allocation's own first), else the study's own points of it",
    "no comm/compute overlap (ddp overlaps: an upper bound for it), no contention beyond what "
    "the fitted points had; strong scaling needs at least one sample per rank (– where not)",
    "on CPU, where a node's ranks outnumber its cores (fingerprint `cpu_count`), each rank "
    "runs ranks/cores times slower, its compute and its comm alike",
]


def _allocation(check: dict, comm_fit: str) -> str:
    """' (fingerprint ID, link L, comm: SOURCE)': a fit_check's allocation."""
    link = f", link {check['link']}" if check.get("link") else ""
    comm = f", comm: {check['comm_fit']}" if check["comm_fit"] != comm_fit else ""
    return f" (fingerprint {check['fingerprint_id']}{link}{comm})"


def forecast_markdown(fc: dict) -> list[str]:
    lines = ["## Forecast", "",
             f"Predicted time per epoch (s) on worlds {', '.join(map(str, fc['worlds']))} with "
             f"nodes of {fc['gpus_per_node']} ranks, per sync, weak (batch per rank as measured) "
             "and strong (the global batch as measured). A forecast is shown only with its "
             "held-out error (fitted on the smaller worlds, the largest predicted), and marked "
             f"UNRELIABLE where that error, or the fitted model's miss of any measured world, "
             f"is beyond ±{fc['target']:.0%}. Assumptions:", ""]
    lines += [f"- {a}" for a in fc["assumptions"]] + [""]
    for s in fc["series"]:
        lines += [f"### sync={s['sync']} on {s['device']} ({s['workload']})", ""]
        h = s["heldout"]
        if h and h["rel_error"] is not None:
            lines += [f"Held-out check: fitted on worlds {h['fitted_worlds']}, predicted world "
                      f"{h['predicted_world']}: {sig(h['predicted_s'])} s vs measured "
                      f"{sig(h['measured_s'])} s, error {h['rel_error']:+.0%} (comm: {h['comm_fit']}).", ""]
        if s.get("fit_check"):
            several = len({f.get("fingerprint_id") for f in s["fit_check"]}) > 1
            lines += ["The model fitted on every world vs the measured ones: " + ", ".join(
                f"world {f['world']}{_allocation(f, s['comm_fit']) if several else ''} {sig(f['predicted_s'])} s "
                f"vs {sig(f['measured_s'])} s ({f['rel_error']:+.0%})" for f in s["fit_check"])
                + ".", ""]
        if not s["shown"]:
            lines += [f"No forecast: {s['why']}.", ""]
            continue
        f = s["fit"]
        top = max(f_["world"] for f_ in s["fit_check"]) if s["fit_check"] else None
        lines += [f"Comm fit: {s['comm_fit']}; alpha {sig(f['intra']['alpha_us'])} µs, beta "
                  f"{sig(f['intra']['beta_ns_per_byte'])} ns/B intra-node"
                  + (f"; alpha {sig(f['cross']['alpha_us'])} µs, beta {sig(f['cross']['beta_ns_per_byte'])} "
                     "ns/B cross-node" if f["cross"] and f["cross"] != f["intra"] else
                     " (no cross-node data: this fit for every link)")
                  + f". Compute {sig(f['compute_ms_c0'])} ms + {sig(f['compute_ms_per_sample'])} "
                  "ms/sample per step.", "",
                  ("**UNRELIABLE**: " if not s["reliable"] else "Forecast, ")
                  + f"{s['why']}" + (f"; measured up to world {top}, the rest is the model's "
                                      "arithmetic" if top else "") + ":", "",
                  "| world | nodes | weak: epoch (s) | weak: comm ms/step | strong: batch/rank | "
                  "strong: epoch (s) | strong: comm ms/step |", "|---|---|---|---|---|---|---|"]
        by = {(p["world"], p["mode"]): p for p in s["predictions"]}
        cells = (("weak", "epoch_s"), ("weak", "comm_ms"), ("strong", "batch_per_rank"),
                 ("strong", "epoch_s"), ("strong", "comm_ms"))
        lines += [md_row([n, by[(n, "weak")]["nodes"], *(sig(by[(n, mode)][k]) for mode, k in cells)])
                  for n in fc["worlds"]] + [""]
    return lines
