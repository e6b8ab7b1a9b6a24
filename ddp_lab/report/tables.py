"""The report's tables, from summary.json and metrics.jsonl: time per
epoch across allocations (with the statistics of repeats), phases, the
comm model, the bench, memory, allocations, the doctor's checks.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from ..folder import doctor as records
from ..predict.costmodel import pow2_label
from ..world import fingerprint
from .alpha_beta import fit_all, fit_alpha_beta, Fits, formula, predict_comm_s
from .run import PHASES, Run, usable


# Statistics of repeats: mean, standard deviation, 95% intervals.

LEVEL = 0.95
MIN_REPEATS = 3  # the fewest values an interval is given for


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float  # arithmetic mean
    std: Optional[float]  # sample standard deviation; None for one value
    ci95: Optional[tuple[float, float]]  # None below MIN_REPEATS values


def t_quantile(df: float) -> float:
    """Student's t at (1 + LEVEL) / 2 with `df` degrees of freedom."""
    # lazy: scipy.stats takes about 1.2 s to load, and only intervals (3+ repeats) need it
    from scipy import stats

    return float(stats.t.ppf((1 + LEVEL) / 2, df))


def summarize(values: Sequence[float]) -> Optional[Summary]:
    """n, mean, std and the log-scale 95% interval of positive values."""
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
    """num.mean / den.mean and its 95% interval (delta method on the log ratio, Welch's df); no
    interval when either side has fewer than MIN_REPEATS values."""
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
    """v to 3 significant digits, no exponent: 0.0123, 1.23, 12.3, 1234."""
    if v is None:
        return none
    if v == 0 or not math.isfinite(v):
        return format(v, "g")
    return f"{v:.{max(0, 2 - math.floor(math.log10(abs(v))))}f}"


def _f(v: Optional[float], fmt: str = ".3f", none: str = "–") -> str:
    return none if v is None else format(v, fmt)


def md_row(cells) -> str:
    """One Markdown table row of `cells` (the report's and the benchmarks' tables)."""
    return "| " + " | ".join(map(str, cells)) + " |"


def workload_titles(items: list[dict], keys: list[tuple]) -> dict[tuple, str]:
    """(device, workload) -> a short title, the whole workload where two
    short ones read alike, the device where there are several."""
    short = {(i["device"], i["workload"]): i.get("workload_short") or i["workload"] for i in items}
    out = {k: short[k] for k in keys}
    if len(set(out.values())) < len(out):
        out = {k: k[1] for k in keys}
    if len({k[0] for k in keys}) > 1:
        out = {k: f"{k[0]}: {t}" for k, t in out.items()}
    return out


def _ms(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else seconds * 1e3


def _mean(values: list) -> Optional[float]:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _ci(pair) -> Optional[list[float]]:
    return list(pair) if pair else None


def scaling_groups(runs: list[Run], warmup: Optional[int] = None) -> list[dict]:
    """Completed training runs as scaling series, one per (sync, device, workload); runs of one
    world size, nodes x procs and fingerprint are repeats of one point. Speedup and efficiency as
    docs/scaling.md, "Reading a scaling report", defines them."""
    series: dict[tuple, list[Run]] = {}
    for r in usable(runs):
        series.setdefault((r.description.series_label(), r.device_kind, r.workload), []).append(r)
    out = []
    for (sync, device, workload), members in sorted(series.items(), key=lambda kv: str(kv[0])):
        points: dict[tuple, list[Run]] = {}
        for r in members:
            key = (r.world_size or 1, r.get("nodes"), r.get("nproc_per_node"), r.fingerprint_id)
            points.setdefault(key, []).append(r)
        rows = [_point_row(key, sorted(rs, key=lambda r: str(r.path)), warmup)
                for key, rs in sorted(points.items(), key=lambda kv: str(kv[0]))]
        rows = sorted((x for x in rows if x["time"] is not None),
                      key=lambda x: (x["world_size"], x["nodes"] or 0, x["time"].mean))
        if not rows:
            continue
        n0 = rows[0]["world_size"]
        bases = [x for x in rows if x["world_size"] == n0]
        several_worlds = len({x["world_size"] for x in rows}) > 1
        fps = {r.fingerprint_id: r.fingerprint for r in members}
        first = members[0]
        first_cap, notes, differs = first.cfg("train").get("max_steps_per_epoch"), [], []
        for x in rows:
            base = next((b for b in bases if b["fingerprint_id"] == x["fingerprint_id"]), bases[0])
            x.update(speedup=None, speedup_ci95=None, efficiency=None, efficiency_ci95=None,
                     baseline_world_size=n0, baseline_run=base["run"], baseline_n=base["time"].n,
                     baseline_fingerprint_id=base["fingerprint_id"], cross_fingerprint=False)
            if not several_worlds:
                # repeats are never a speedup of each other
                continue
            # the baseline against itself is 1 exactly, not a ratio
            sp, ci = (1.0, None) if base is x else ratio(base["time"], x["time"])
            # efficiency per unit of work: where an epoch's samples grow with the world (a step cap
            # per rank, weak scaling) the ideal time is flat, not 1/n (uncapped, the factor stays 1)
            capped = bool(first_cap) and x["epoch_samples"] and base["epoch_samples"]
            k = (x["epoch_samples"] / base["epoch_samples"] if capped else 1.0) * n0 / x["world_size"]
            x.update(speedup=sp, speedup_ci95=_ci(ci), efficiency=sp * k,
                     efficiency_ci95=[c * k for c in ci] if ci else None)
            if base["fingerprint_id"] != x["fingerprint_id"]:
                x["cross_fingerprint"] = True
                diff = fingerprint.differences(fps.get(base["fingerprint_id"], {}),
                                               fps.get(x["fingerprint_id"], {}))
                what = "; ".join(diff) or "a run without a fingerprint"
                notes.append(f"world {x['world_size']} (fingerprint {x['fingerprint_id']}) is compared "
                             f"with world {n0} (fingerprint {base['fingerprint_id']}): {what}")
                # the screen says each difference once (summary.py)
                differs.append(what)
        for x in rows:
            t = x.pop("time")
            x.update(time_n=t.n, epoch_time_s_mean=t.mean, epoch_time_s_std=t.std,
                     epoch_time_s_ci95=_ci(t.ci95))
        out.append({"sync": sync, "device": device, "workload": first.workload_label(),
                    "workload_short": first.workload_short(),
                    "workload_panel": first.workload_label(epochs=False),
                    "epochs": first.get("epochs"),
                    "scaling": first.scaling, "baseline": rows[0]["baseline_run"],
                    "baseline_world_size": n0, "rows": rows,
                    "fingerprints": {k: fps[k] for k in sorted(fps)}, "fingerprint_notes": notes,
                    "fingerprint_differences": differs})
    return out


def _point_row(key: tuple, rs: list[Run], warmup: Optional[int]) -> dict:
    """One point: its repeats' mean post-warm-up epoch times summarised."""
    world, nodes, per, fid = key
    timed = [t for t in (r.epoch_time_values(warmup) for r in rs) if t[0]]
    values, first = [sum(v) / len(v) for v, _ in timed], rs[0]
    return {
        "run": str(first.path), "runs": [str(r.path) for r in rs], "sync": first.description.series_label(),
        "algorithm": first.get("sync", "?"),
        "launcher": first.get("launcher", "?"), "backend": first.get("backend", "?"),
        "device": first.device_kind, "nodes": nodes, "nproc_per_node": per, "world_size": world,
        "epochs": first.get("epochs_run", first.get("epochs")), "fingerprint_id": fid,
        "time": summarize(values), "repeat_values_s": values,
        "warmup_epochs": sorted({skip for _, skip in timed}),
        "comm_fraction": _mean([r.get("comm_fraction") for r in rs]),
        "comm_exposed_fraction": _mean([r.summary.get("comm_exposed_fraction") for r in rs])
        if all(r.summary.get("comm_exposed_fraction") is not None for r in rs) else None,
        "samples_per_s": _mean([r.samples_per_s() for r in rs]),
        "test_accuracy": _mean([r.get("test_accuracy") for r in rs]),
        "global_batch": first.global_batch, "scaling": first.scaling,
        "epoch_samples": _mean([r.epoch_samples() for r in rs]),
        "workload": first.workload_label(),
    }


def ci_cell(ci, n: int, fmt) -> str:
    """An interval, each end by `fmt` (a format spec or a function), or
    why there is none: "n=2: not meaningful" (too few repeats), else "–"."""
    if ci:
        num = fmt if callable(fmt) else (lambda v: format(v, fmt))
        return f"[{num(ci[0])}, {num(ci[1])}]"
    return f"n={n}: not meaningful" if 1 < n < MIN_REPEATS else "–"


def ratio_ci_cell(row: dict, key: str, fmt: str) -> str:
    """A speedup's or efficiency's interval cell ("baseline" on its own row)."""
    if row[key] is None or row["run"] == row["baseline_run"]:
        return "–" if row[key] is None else "baseline"
    return ci_cell(row[f"{key}_ci95"], min(row["time_n"], row["baseline_n"]), fmt)


def scaling_markdown(groups: list[dict], short, warmup: Optional[int] = None) -> list[str]:
    wtext = ("the first epoch of every run with more than one is left out as warm-up"
             if warmup is None else f"the first {warmup} epoch(s) of every run with more than "
             f"{warmup} are left out as warm-up")
    lines = ["## Time per epoch across allocations", "",
             f"Time per epoch, EXCLUDING WARM-UP: {wtext} (`--warmup N`); a run's value is the "
             "mean of its remaining epoch times (metrics.jsonl `epoch_time_s`). Runs of the same "
             "sync, workload, world size, nodes x procs and fingerprint are repeats of one point: "
             "n, mean, standard deviation and 95% CI (Student t on the logs of the repeats' values, "
             "exponentiated: an interval around their geometric mean that stays above zero; "
             f"none below {MIN_REPEATS} repeats, where it is not meaningful). speedup = "
             "baseline mean / mean, its 95% CI by the delta method on its log (Welch's degrees "
             "of freedom); efficiency = speedup x "
             "baseline ranks / ranks x the epoch's samples / the baseline's (an epoch capped at "
             "a number of steps per rank grows with the world: its ideal time is flat); the "
             "baseline is the smallest world of the same sync, device "
             "and workload (with the row's fingerprint where there is one). Repeats are never a "
             "speedup of each other: a series of one world size has none. in-flight comm = "
             "summary.json `comm_fraction` (the union of the collectives' intervals / step "
             "time); exposed comm = `comm_exposed_fraction` (the part of it after the step's "
             "last gradient was ready, ddp_lab.timing; – where the run has none).", ""]
    if not groups:
        return lines + ["No completed training run to compare.", ""]
    for g in groups:
        lines += [f"### sync={g['sync']} on {g['device']} ({g['workload']}); baseline: "
                  f"world {g['baseline_world_size']}", ""]
        if "steps/epoch" in g["workload"] and g.get("scaling") != "strong" \
                and "global batch" not in g["workload"]:
            # (strong scaling: a step is one global batch on every world)
            lines += ["Epochs capped at a number of steps *per rank* (train.max_steps_per_epoch): "
                      "the work per epoch grows with the world size, so the speedup (a time "
                      "ratio) falls below 1 even when scaling is perfect; the efficiency counts "
                      "the work (1 = the same time per epoch as the baseline).", ""]
        lines += ["| nodes x procs | world | launcher | backend | n | epoch mean (s) | std (s) | "
                  "95% CI (s) | speedup | speedup 95% CI | efficiency | efficiency 95% CI | "
                  "in-flight comm | exposed comm | samples/s | test acc | fingerprint | runs |",
                  "|" + "---|" * 18]
        for r in g["rows"]:
            flag = " ⚠" if r["cross_fingerprint"] else ""
            runs = ", ".join(short(p) for p in r["runs"])
            lines.append(md_row([
                f"{r['nodes']}x{r['nproc_per_node']}", r["world_size"], r["launcher"], r["backend"],
                r["time_n"], _f(r["epoch_time_s_mean"]), _f(r["epoch_time_s_std"]),
                ci_cell(r["epoch_time_s_ci95"], r["time_n"], ".3f"), _f(r["speedup"], ".2f") + flag,
                ratio_ci_cell(r, "speedup", ".2f"), _f(r["efficiency"], ".0%"),
                ratio_ci_cell(r, "efficiency", ".0%"), _f(r["comm_fraction"], ".0%"),
                _f(r["comm_exposed_fraction"], ".0%", "--"), _f(r["samples_per_s"], ".0f"),
                _f(r["test_accuracy"], ".4f"), r["fingerprint_id"], runs]))
        lines.append("")
        for note in g["fingerprint_notes"]:
            lines += [f"⚠ Across fingerprints: {note}.", ""]
    return lines


def phase_rows(runs: list[Run]) -> list[dict]:
    rows = []
    for r in usable(runs):
        ph = r.phase_ms()
        comm = r.comm_per_step()
        # a time per step: compared across epoch counts and step caps
        what, nodes, per = r.description, r.get("nodes"), r.get("nproc_per_node")
        # summary.json `straggler` in a cell: `rank 1 +5.02 ms (92%)`, or –
        s = r.summary.get("straggler")
        late = f"rank {s['rank']} +{s['late_ms']:.2f} ms ({s['share']:.0%})" if s else "–"
        rows.append({"run": str(r.path), "sync": what.series_label(), "world_size": r.world_size,
                     "device": r.device_kind, "workload": what.workload_words(),
                     "workload_short": what.workload_words(),
                     "allocation": f"{nodes}x{per}" if nodes and per else "?",
                     "fingerprint_id": r.fingerprint_id,
                     **{f"{p}_ms": ph[p] for p in (*PHASES, "step")},
                     "comm_ms": _ms(comm["time_s"]),
                     "straggler": late})
    return sorted(rows, key=lambda x: (x["sync"], x["world_size"] or 0, x["run"]))


def phase_markdown(rows: list[dict], short) -> list[str]:
    return ["## Phase times per step", "",
             "Mean ms per step over all epochs (metrics.jsonl `phase_s.<phase>.mean`); comm = "
             "`comm.time_s / steps`, the time the synchroniser's collectives took (with ddp it "
             "overlaps backward, so it is not a separate phase). straggler = summary.json "
             "`straggler`: the rank the others wait for, how long (median ms per step) and the "
             "share of steps it came last (– when no rank is clearly the one; docs/sync.md).", "",
             "| sync | world | data | forward | backward | sync | optim | step | comm | straggler | run |",
             "|---|---|---|---|---|---|---|---|---|---|---|",
            *(md_row([r["sync"], r["world_size"], *(_f(r[f"{p}_ms"]) for p in (*PHASES, "step", "comm")),
                      r.get("straggler", "–"), short(r["run"])]) for r in rows), ""]


def skipped_markdown(runs: list[Run], short) -> list[str]:
    bad = [r for r in runs if not r.ok]
    if not bad:
        return []
    lines = ["## Skipped run folders", "", "Not compared, with the reason:", ""]
    lines += [f"- `{short(str(r.path))}` ({r.kind}): {' '.join(r.status.split())}" for r in bad]
    return lines + [""]


def summary_counts(runs: list[Run]) -> dict[str, Any]:
    return {"train": len(usable(runs)), "bench": len(usable(runs, "bench")),
            "skipped": sum(not r.ok for r in runs)}


# The communication tables: the bench's alpha-beta fits, each run's predicted comm, busbw.

def all_reduce_series(run: Run, correct: bool = False) -> dict[tuple[str, str], list[dict]]:
    """A bench run's all_reduce rows (only the correct ones if `correct`) by (impl, group)."""
    out: dict[tuple[str, str], list[dict]] = {}
    for x in run.bench.get("rows", []):
        if x.get("op") == "all_reduce" and (x.get("correct") or not correct):
            out.setdefault((x["impl"], x["group"]), []).append(x)
    return out


def bench_fits(runs: list[Run]) -> list[dict]:
    out = []
    for r in usable(runs, "bench"):
        rows = r.bench.get("rows", [])
        fits = [f for f in (fit_alpha_beta(rows, i, g) for i, g in sorted(all_reduce_series(r))) if f]
        # what predictions use: one fit per collective and implementation
        out.append({"run": r, "primary": fit_alpha_beta(rows), "fits": fits, "by_op": fit_all(rows)})
    return out


def _match_fit(run: Run, fits: list[dict], short) -> tuple[Optional[Fits], str]:
    """The fit of the bench on the same allocation (real nodes before simulated ones, the latest
    first), else of the nearest world size on the same backend and device, named as such."""
    same = [f for f in fits if f["primary"]
            and f["run"].get("backend") == run.get("backend")
            and f["run"].device_kind == run.device_kind]
    if not same:
        return None, "no bench run on this backend/device"
    n = run.world_size or 1
    exact = [f for f in same if f["run"].world_size == n and f["run"].get("nodes") == run.get("nodes")]
    if exact:
        best = sorted(exact, key=lambda f: (f["run"].summary.get("simulated_nodes") is None,
                                            str(f["run"].path)))[-1]
        return best["by_op"] or best["primary"], f"same allocation: {short(str(best['run'].path))}"
    near = min(same, key=lambda f: abs((f["run"].world_size or 0) - n))
    return (near["by_op"] or near["primary"],
            f"fit at world {near['run'].world_size}: {short(str(near['run'].path))}")


def comm_model_rows(runs: list[Run], fits: list[dict], short=str) -> list[dict]:
    rows = []
    for r in usable(runs):
        fit, source = _match_fit(r, fits, short)
        comm = r.comm_per_step()
        sync, n = r.get("sync", "?"), r.world_size or 1
        payload, measured = comm["payload_bytes"], comm["time_s"]
        pred = predict_comm_s(sync, n, payload, comm["calls"], fit) if fit else None
        rows.append({
            "run": str(r.path), "sync": sync, "world_size": n, "formula": formula(sync),
            "calls_per_step": comm["calls"],
            "payload_MB_per_step": None if payload is None else payload / 1e6,
            "predicted_ms": _ms(pred), "measured_comm_ms": _ms(measured),
            "sync_phase_ms": r.phase_ms()["sync"], "fit_source": source,
            "ratio": (measured / pred) if pred and measured else None,
        })
    rows.sort(key=lambda x: (x["sync"], x["world_size"], x["run"]))
    return rows


def comm_model_markdown(fits: list[dict], rows: list[dict], short) -> list[str]:
    lines = ["## Communication: alpha-beta model vs measured", "",
             "alpha = latency per message, beta = seconds per byte (1/beta = link bandwidth), "
             "fitted by least squares (weights 1/time) on each bench run's all_reduce time per "
             "call vs bytes, with the implementation's own cost model (torch modelled as ring: "
             "2(n-1)α + 2(n-1)/n·m·β). rel. RMS = how far the line is from the points. Each "
             "synchroniser call is priced with the fit of its own collective and algorithm "
             "(reduce and broadcast rows too when the bench measured them); the library "
             "all_reduce's fit (used) where the bench has none.", ""]
    if not fits:
        lines += ["No completed bench run: run `python -m ddp_lab.bench` on the same allocation "
                  "to fit alpha and beta.", ""]
    else:
        lines += ["| bench run | allocation | impl (model) | group | n | alpha (µs) | beta (ns/B) | "
                  "1/beta (GB/s) | points | rel. RMS |", "|---|---|---|---|---|---|---|---|---|---|"]
        for f in fits:
            others = [x for k, x in f["by_op"].items() if k[0] != "all_reduce"]
            for fit in f["fits"] + others:
                mark = " (used)" if fit == f["primary"] else ""
                op = "" if fit.op == "all_reduce" else f"{fit.op}: "
                lines.append(md_row([
                    short(str(f["run"].path)), f["run"].bench["meta"].get("allocation", "?"),
                    f"{op}{fit.impl} ({fit.algorithm}){mark}", fit.group, fit.n,
                    f"{fit.alpha_s * 1e6:.1f}", f"{fit.beta_s_per_byte * 1e9:.3f}",
                    _f(fit.bandwidth_GBps), fit.points, f"{fit.rel_rms:.0%}"]))
        lines.append("")
    if rows:
        lines += ["Per training step, as the synchroniser recorded it (metrics.jsonl, divided by "
                  "`steps`): `comm.calls` collective calls carrying `comm.payload_bytes` in all; "
                  "a bucket is one call (two for reduce_broadcast: a reduce and a broadcast) of "
                  "payload / calls bytes = m. measured = `comm.time_s / steps`; sync phase = "
                  "`phase_s.sync.mean`.", "",
                  "| sync | world | model | calls/step | payload (MB/step) | predicted (ms/step) | "
                  "measured comm (ms/step) | sync phase (ms/step) | measured / predicted | fit | run |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        ms = ("payload_MB_per_step", "predicted_ms", "measured_comm_ms", "sync_phase_ms")
        lines += [md_row([r["sync"], r["world_size"], r["formula"], _f(r["calls_per_step"], ".1f"),
                          *(_f(r[k]) for k in ms), _f(r["ratio"], ".2f"), r["fit_source"],
                          short(r["run"])]) for r in rows]
        lines.append("")
    return lines


def bench_markdown(runs: list[Run], short) -> list[str]:
    benches = usable(runs, "bench")
    if not benches:
        return []
    lines = ["## Collective benchmarks", "",
             "all_reduce peak bus bandwidth per bench run and series (GB/s = 1e9 bytes/s, "
             "nccl-tests' busbw); each bench run's own bench.md has every op and size.", "",
             "| bench run | allocation | op | impl | group | n | peak busbw (GB/s) | at elements | wrong |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in benches:
        alloc = r.bench.get("meta", {}).get("allocation", "?")
        for (impl, group), xs in all_reduce_series(r).items():
            good = [x for x in xs if x.get("correct")]
            best = max(good, key=lambda x: x["busbw_GBps"]) if good else None
            lines.append(md_row([short(str(r.path)), alloc, "all_reduce", impl, group, xs[0]["group_size"],
                                 _f(best["busbw_GBps"] if best else None),
                                 pow2_label(best["elements"]) if best else "–", len(xs) - len(good)]))
    return lines + [""]


KINDS = ("param", "grad", "optimizer_state")


def memory_rows(runs: list[Run], short) -> list[dict[str, Any]]:
    """What one rank holds, per completed training run that recorded it."""
    rows = []
    for r in usable(runs):
        s = r.summary
        if s.get("memory_optimizer_state_bytes") is None:
            continue
        rows.append({"run": short(str(r.path)), "model": s.get("model"), "sync": s.get("sync"),
                     "world_size": r.world_size,
                     **{f"{k}_MB": s[f"memory_{k}_bytes"] / 1e6 for k in KINDS}})
    return sorted(rows, key=lambda x: (str(x["model"]), x["world_size"] or 0, str(x["sync"])))


def memory_markdown(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = ["## Memory per rank", "",
             "What one rank holds (summary.json `memory_*_bytes`): sync=zero1 keeps "
             "1/world of the optimiser state, every other sync all of it.", "",
             "| model | ranks | sync | parameters MB | gradients MB | optimiser state MB | run |",
             "| --- | ---: | --- | ---: | ---: | ---: | --- |"]
    return lines + [md_row([r["model"], r["world_size"], r["sync"], *(f"{r[f'{k}_MB']:.1f}" for k in KINDS),
                            f"`{r['run']}`"]) for r in rows] + [""]


def segment_rows(runs: list[Run], short) -> list[dict[str, Any]]:
    """One row per allocation of every training run that used several (summary.json `segments`: a
    requeued SLURM job, a re-created pod, a resumed run)."""
    rows: list[dict[str, Any]] = []
    for r in runs:
        segs = r.summary.get("segments") if r.kind == "train" else None
        if not isinstance(segs, list) or len(segs) < 2:
            continue
        for i, seg in enumerate(s for s in segs if isinstance(s, dict)):
            wall = None
            with contextlib.suppress(KeyError, TypeError, ValueError):
                wall = (datetime.datetime.fromisoformat(seg["end"])
                        - datetime.datetime.fromisoformat(seg["start"])).total_seconds()
            rows.append({
                "run": short(str(r.path)), "segment": i + 1,
                **{k: seg.get(k) for k in ("job_id", "restart", "nodes")},
                "hosts": ",".join(seg.get("hosts") or []), "start": seg.get("start"),
                "wall_s": wall, "from": _position(seg, "start"), "to": _position(seg, "end"),
                **{k: seg.get(k) for k in ("steps_done", "epochs_done", "epoch_time_s_median", "status")}})
    return rows


def _position(seg: dict, which: str) -> str:
    epoch, step = seg.get(f"{which}_epoch"), seg.get(f"{which}_step")
    if epoch is None:
        return "?"
    return f"epoch {epoch}" + (f" + {step} steps" if step else "")


def segments_markdown(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = ["## Allocations of runs that used several", "",
             "One row per segment of summary.json: a SLURM requeue, a re-created pod or a "
             "resume starts a new one. Epoch time: the median of the epochs the segment "
             "finished (\"-\": it finished none).", "",
             "| run | # | job | restart | nodes | hosts | start | wall s | from | to | steps "
             "| epochs | epoch s | status |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(md_row([
            f"`{row['run']}`", row["segment"], row["job_id"] or "-", _f(row["restart"], "d", "-"),
            _f(row["nodes"], "d", "-"), row["hosts"] or "-", row["start"] or "-",
            _f(row["wall_s"], ".0f", "-"), row["from"], row["to"], _f(row["steps_done"], "d", "-"),
            _f(row["epochs_done"], "d", "-"), _f(row["epoch_time_s_median"], ".2f", "-"),
            row["status"] or "-"]))
    return lines + [""]


def doctor_markdown(runs) -> list[str]:
    """Each doctor.json beside the runs (docs/doctor.md), its verdict and
    the runs of its fingerprint, so a slow series reads beside what the
    doctor said of its nodes; none when no doctor ran there."""
    roots = {Path(r.path).parent for r in runs} | {Path(r.path) for r in runs}
    docs = records.find(roots)
    if not docs:
        return []
    by_fid: dict[str, list[str]] = {}
    for r in usable(runs):
        by_fid.setdefault(r.fingerprint_id, []).append(Path(r.path).name)
    lines = ["## The allocations' doctor checks", "",
             "`python -m ddp_lab.doctor` before the runs (docs/doctor.md): each allocation's "
             "checks beside its training runs of the same fingerprint.", "",
             "| fingerprint | doctor | finished | took | verdict | runs of this fingerprint |",
             "| --- | --- | --- | ---: | --- | --- |"]
    for path, doc in docs:
        bad = records.failing(doc)
        verdict = (f"{len(doc.get('checks', []))} checks ok" if not bad else
                   f"{len(bad)} FAIL: " + "; ".join(b.removeprefix("FAIL ") for b in bad))
        fid = doc.get("fingerprint_id") or "?"
        lines.append(md_row([fid, path.parent.name, doc.get("finished", "?"),
                             f"{doc.get('elapsed_s', 0):.0f} s", verdict.replace("|", "/"),
                             ", ".join(by_fid.get(fid, [])) or "-"]))
    return lines + [""]
