"""Comparison tables: time per epoch across allocations (scaling),
phases, skipped folders, from the run folders' summary.json and
metrics.jsonl (the comm model and the bench's peaks: comm_tables.py; a
run's several allocations: segments.py).
"""

from __future__ import annotations

from typing import Any, Optional

from ..world import fingerprint
from . import stats
from .run import PHASES, Run


def _f(v: Optional[float], fmt: str = ".3f", none: str = "–") -> str:
    return none if v is None else format(v, fmt)


def allocation(run: Run) -> str:
    nodes, per = run.get("nodes"), run.get("nproc_per_node")
    return f"{nodes}x{per}" if nodes and per else "?"


def workload_titles(items: list[dict], keys: list[tuple]) -> dict[tuple, str]:
    """(device, workload) -> a short title ("mlp, batch 64/rank, full
    epochs"); the whole workload where two short ones would read alike;
    the device where there are several."""
    short = {(i["device"], i["workload"]): i.get("workload_short") or i["workload"] for i in items}
    out = {k: short[k] for k in keys}
    if len(set(out.values())) < len(out):
        out = {k: k[1] for k in keys}
    if len({k[0] for k in keys}) > 1:
        out = {k: f"{k[0]}: {t}" for k, t in out.items()}
    return out


def _mean(values: list) -> Optional[float]:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _ci(pair) -> Optional[list[float]]:
    return list(pair) if pair else None


def scaling_groups(runs: list[Run], warmup: Optional[int] = None) -> list[dict]:
    """Completed training runs as scaling series, one per (sync, device,
    workload); runs of one world size, nodes x procs and fingerprint are
    repeats of one point. Speedup and efficiency as docs/scaling.md,
    "Reading a scaling report", defines them."""
    series: dict[tuple, list[Run]] = {}
    for r in runs:
        if r.kind == "train" and r.ok:
            series.setdefault((r.description.series_label(), r.device_kind, r.workload), []).append(r)
    out = []
    for (sync, device, workload), members in sorted(series.items(), key=lambda kv: str(kv[0])):
        points: dict[tuple, list[Run]] = {}
        for r in members:
            key = (r.world_size or 1, r.get("nodes"), r.get("nproc_per_node"), r.fingerprint_id)
            points.setdefault(key, []).append(r)
        rows = [_point_row(key, sorted(rs, key=lambda r: str(r.path)), warmup)
                for key, rs in sorted(points.items(), key=lambda kv: str(kv[0]))]
        rows = [r for r in rows if r["time"] is not None]
        if not rows:
            continue
        rows.sort(key=lambda x: (x["world_size"], x["nodes"] or 0, x["time"].mean))
        n0 = rows[0]["world_size"]
        bases = [x for x in rows if x["world_size"] == n0]
        several_worlds = len({x["world_size"] for x in rows}) > 1
        fps = {r.fingerprint_id: r.fingerprint for r in members}
        first_cap = (members[0].config.get("train") or {}).get("max_steps_per_epoch")
        notes, differs = [], []
        for x in rows:
            base = next((b for b in bases if b["fingerprint_id"] == x["fingerprint_id"]), bases[0])
            x.update(speedup=None, speedup_ci95=None, efficiency=None, efficiency_ci95=None,
                     baseline_world_size=n0, baseline_run=base["run"], baseline_n=base["time"].n,
                     baseline_fingerprint_id=base["fingerprint_id"], cross_fingerprint=False)
            if not several_worlds:
                # repeats are never a speedup of each other
                continue
            # the baseline against itself is 1 exactly, not a ratio of
            # two samples
            sp, ci = (1.0, None) if base is x else stats.ratio(base["time"], x["time"])
            n = x["world_size"]
            # efficiency per unit of work: where an epoch's samples grow
            # with the world (a step cap per rank in weak scaling) the
            # ideal time stays flat, not 1/n (uncapped, an epoch is the
            # dataset whatever the world: the factor stays 1)
            capped = bool(first_cap) and x["epoch_samples"] and base["epoch_samples"]
            work = x["epoch_samples"] / base["epoch_samples"] if capped else 1.0
            k = work * n0 / n
            x.update(speedup=sp, speedup_ci95=_ci(ci), efficiency=sp * k,
                     efficiency_ci95=[c * k for c in ci] if ci else None)
            if base["fingerprint_id"] != x["fingerprint_id"]:
                x["cross_fingerprint"] = True
                diff = fingerprint.differences(fps.get(base["fingerprint_id"], {}),
                                               fps.get(x["fingerprint_id"], {}))
                what = "; ".join(diff) or "a run without a fingerprint"
                notes.append(f"world {n} (fingerprint {x['fingerprint_id']}) is compared with world "
                             f"{n0} (fingerprint {base['fingerprint_id']}): {what}")
                # the screen says each difference once (summary.py)
                differs.append(what)
        for x in rows:
            t = x.pop("time")
            x.update(time_n=t.n, epoch_time_s_mean=t.mean, epoch_time_s_std=t.std,
                     epoch_time_s_ci95=_ci(t.ci95))
        first = members[0]
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
    """One point: its repeats' per-run values (mean post-warm-up epoch
    time) summarised."""
    world, nodes, per, fid = key
    values, skipped = [], []
    for r in rs:
        v, skip = r.epoch_time_values(warmup)
        if v:
            values.append(sum(v) / len(v))
            skipped.append(skip)
    first = rs[0]
    return {
        "run": str(first.path), "runs": [str(r.path) for r in rs], "sync": first.description.series_label(),
        "algorithm": first.get("sync", "?"),
        "launcher": first.get("launcher", "?"), "backend": first.get("backend", "?"),
        "device": first.device_kind, "nodes": nodes, "nproc_per_node": per, "world_size": world,
        "epochs": first.get("epochs_run", first.get("epochs")), "fingerprint_id": fid,
        "time": stats.summarize(values), "repeat_values_s": values,
        "warmup_epochs": sorted(set(skipped)),
        "comm_fraction": _mean([r.get("comm_fraction") for r in rs]),
        "comm_exposed_fraction": _mean([r.summary.get("comm_exposed_fraction") for r in rs])
        if all(r.summary.get("comm_exposed_fraction") is not None for r in rs) else None,
        "samples_per_s": _mean([r.samples_per_s() for r in rs]),
        "test_accuracy": _mean([r.get("test_accuracy") for r in rs]),
        "global_batch": first.global_batch, "scaling": first.scaling,
        "epoch_samples": _mean([r.epoch_samples() for r in rs]),
        "workload": first.workload_label(),
    }


def _pm(ci, fmt) -> str:
    """[lo, hi], each by `fmt`: a format spec (".3f") or a function
    (stats.sig)."""
    num = fmt if callable(fmt) else (lambda v: format(v, fmt))
    return f"[{num(ci[0])}, {num(ci[1])}]" if ci else "–"


def ci_cell(ci, n: int, fmt) -> str:
    """An interval, or why there is none: "n=2: not meaningful" (too few
    repeats), "–" (one repeat, or a value that has no interval)."""
    if ci:
        return _pm(ci, fmt)
    return f"n={n}: not meaningful" if 1 < n < stats.MIN_REPEATS else "–"


def ratio_ci_cell(row: dict, key: str, fmt: str) -> str:
    """A speedup's or efficiency's interval cell: "baseline" on the
    baseline's own row."""
    if row[key] is None:
        return "–"
    if row["run"] == row["baseline_run"]:
        return "baseline"
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
             f"none below {stats.MIN_REPEATS} repeats, where it is not meaningful). speedup = "
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
            # (strong scaling: a step is the same global batch on every
            # world size)
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
            lines.append(
                f"| {r['nodes']}x{r['nproc_per_node']} | {r['world_size']} | {r['launcher']} | "
                f"{r['backend']} | {r['time_n']} | {_f(r['epoch_time_s_mean'])} | "
                f"{_f(r['epoch_time_s_std'])} | {ci_cell(r['epoch_time_s_ci95'], r['time_n'], '.3f')} | "
                f"{_f(r['speedup'], '.2f')}{flag} | {ratio_ci_cell(r, 'speedup', '.2f')} | "
                f"{_f(r['efficiency'], '.0%')} | {ratio_ci_cell(r, 'efficiency', '.0%')} | "
                f"{_f(r['comm_fraction'], '.0%')} | {_f(r['comm_exposed_fraction'], '.0%', '--')} | "
                f"{_f(r['samples_per_s'], '.0f')} | {_f(r['test_accuracy'], '.4f')} | "
                f"{r['fingerprint_id']} | {runs} |")
        lines.append("")
        for note in g["fingerprint_notes"]:
            lines += [f"⚠ Across fingerprints: {note}.", ""]
    return lines


def phase_rows(runs: list[Run]) -> list[dict]:
    rows = []
    for r in runs:
        if r.kind != "train" or not r.ok:
            continue
        ph = r.phase_ms()
        comm = r.comm_per_step()
        # a time per step: compared across epoch counts and step caps
        # (not split by them)
        what = r.description
        rows.append({"run": str(r.path), "sync": what.series_label(), "world_size": r.world_size,
                     "device": r.device_kind, "workload": what.workload_words(),
                     "workload_short": what.workload_words(), "allocation": allocation(r),
                     "fingerprint_id": r.fingerprint_id,
                     **{f"{p}_ms": ph[p] for p in (*PHASES, "step")},
                     "comm_ms": comm["time_s"] * 1e3 if comm["time_s"] is not None else None,
                     "straggler": straggler_text(r.summary.get("straggler"))})
    rows.sort(key=lambda x: (x["sync"], x["world_size"] or 0, x["run"]))
    return rows


def straggler_text(s: Optional[dict]) -> str:
    """summary.json `straggler` in a cell: `rank 1 +5.02 ms (92%)`, or –
    when none named."""
    if not s:
        return "–"
    return f"rank {s['rank']} +{s['late_ms']:.2f} ms ({s['share']:.0%})"


def phase_markdown(rows: list[dict], short) -> list[str]:
    lines = ["## Phase times per step", "",
             "Mean ms per step over all epochs (metrics.jsonl `phase_s.<phase>.mean`); comm = "
             "`comm.time_s / steps`, the time the synchroniser's collectives took (with ddp it "
             "overlaps backward, so it is not a separate phase). straggler = summary.json "
             "`straggler`: the rank the others wait for, how long (median ms per step) and the "
             "share of steps it came last (– when no rank is clearly the one; docs/sync.md).", "",
             "| sync | world | data | forward | backward | sync | optim | step | comm | straggler | run |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['sync']} | {r['world_size']} | " + " | ".join(
            _f(r[f"{p}_ms"], ".3f") for p in (*PHASES, "step", "comm"))
            + f" | {r.get('straggler', '–')} | {short(r['run'])} |")
    return lines + [""]


def skipped_markdown(runs: list[Run], short) -> list[str]:
    bad = [r for r in runs if not r.ok]
    if not bad:
        return []
    lines = ["## Skipped run folders", "", "Not compared, with the reason:", ""]
    lines += [f"- `{short(str(r.path))}` ({r.kind}): {' '.join(r.status.split())}" for r in bad]
    return lines + [""]


def summary_counts(runs: list[Run]) -> dict[str, Any]:
    return {"train": sum(r.kind == "train" and r.ok for r in runs),
            "bench": sum(r.kind == "bench" and r.ok for r in runs),
            "skipped": sum(not r.ok for r in runs)}
