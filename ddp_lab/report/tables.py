"""Comparison tables: scaling across allocations, phases, comm model vs measured, benches.

All numbers come from the run folders' own files: summary.json (median epoch time, comm
share, accuracy), metrics.jsonl (phase times, comm per step), bench.json (bench points).
"""

from __future__ import annotations

import datetime
from typing import Any, Optional

from ..bench.harness import pow2_label
from .model import Fit, fit_alpha_beta, formula, predict_comm_s
from .runs import PHASES, Run


def _f(v: Optional[float], fmt: str = ".3f", none: str = "–") -> str:
    return none if v is None else format(v, fmt)


def allocation(run: Run) -> str:
    nodes, per = run.get("nodes"), run.get("nproc_per_node")
    return f"{nodes}x{per}" if nodes and per else "?"


def scaling_groups(runs: list[Run]) -> list[dict]:
    """Completed training runs grouped by (sync, device, workload), each row with its
    speedup and efficiency against the group's smallest allocation."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        if r.kind == "train" and r.ok:
            groups.setdefault((r.get("sync", "?"), r.device_kind, r.workload), []).append(r)
    out = []
    for (sync, device, workload), members in sorted(groups.items(), key=lambda kv: str(kv[0])):
        members.sort(key=lambda r: (r.world_size or 0, r.get("epoch_time_s_median")))
        base = members[0]  # smallest world; the fastest run if several share that size
        t0, n0 = base.get("epoch_time_s_median"), base.world_size or 1
        rows = []
        for r in members:
            t, n = r.get("epoch_time_s_median"), r.world_size or 1
            speedup = t0 / t if t else None
            rows.append({
                "run": str(r.path), "sync": sync, "launcher": r.get("launcher", "?"),
                "backend": r.get("backend", "?"), "device": device,
                "nodes": r.get("nodes"), "nproc_per_node": r.get("nproc_per_node"),
                "world_size": n, "epochs": r.get("epochs_run", r.get("epochs")),
                "epoch_time_s_median": t, "speedup": speedup,
                "efficiency": speedup * n0 / n if speedup else None,
                "comm_fraction": r.get("comm_fraction"), "test_accuracy": r.get("test_accuracy"),
                "samples_per_s": r.samples_per_s(),
                "baseline_world_size": n0, "baseline_run": str(base.path),
                "workload": base.workload_label(),
            })
        out.append({"sync": sync, "device": device, "workload": base.workload_label(),
                    "baseline": str(base.path), "baseline_world_size": n0, "rows": rows})
    return out


def scaling_markdown(groups: list[dict], short) -> list[str]:
    lines = ["## Time per epoch across allocations", "",
             "Median epoch time in seconds (summary.json `epoch_time_s_median`). speedup = "
             "baseline time / time; efficiency = speedup x baseline ranks / ranks; the baseline "
             "is the smallest allocation of the same sync, device and workload. comm share = "
             "share of step time spent synchronising (summary.json `comm_fraction`).", ""]
    if not groups:
        return lines + ["No completed training run to compare.", ""]
    for g in groups:
        lines += [f"### sync={g['sync']} on {g['device']} ({g['workload']}); baseline: "
                  f"world {g['baseline_world_size']}", ""]
        if "steps/epoch" in g["workload"] and "global batch" not in g["workload"]:
            # (strong scaling: a step is the same global batch on every world size)
            lines += ["Epochs capped at a number of steps *per rank* (train.max_steps_per_epoch): "
                      "the work per epoch grows with the world size, so the speedup here is a "
                      "weak-scaling figure; samples/s compares the throughput.", ""]
        lines += ["| nodes x procs | world | launcher | backend | median epoch (s) | speedup | "
                  "efficiency | comm share | samples/s | test acc | run |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in g["rows"]:
            lines.append(
                f"| {r['nodes']}x{r['nproc_per_node']} | {r['world_size']} | {r['launcher']} | "
                f"{r['backend']} | {_f(r['epoch_time_s_median'])} | {_f(r['speedup'], '.2f')} | "
                f"{_f(r['efficiency'], '.0%')} | {_f(r['comm_fraction'], '.0%')} | "
                f"{_f(r['samples_per_s'], '.0f')} | {_f(r['test_accuracy'], '.4f')} | {short(r['run'])} |")
        lines.append("")
    return lines


def phase_rows(runs: list[Run]) -> list[dict]:
    rows = []
    for r in runs:
        if r.kind != "train" or not r.ok:
            continue
        ph = r.phase_ms()
        comm = r.comm_per_step()
        rows.append({"run": str(r.path), "sync": r.get("sync", "?"), "world_size": r.world_size,
                     **{f"{p}_ms": ph[p] for p in (*PHASES, "step")},
                     "comm_ms": comm["time_s"] * 1e3 if comm["time_s"] is not None else None})
    rows.sort(key=lambda x: (x["sync"], x["world_size"] or 0, x["run"]))
    return rows


def phase_markdown(rows: list[dict], short) -> list[str]:
    lines = ["## Phase times per step", "",
             "Mean ms per step over all epochs (metrics.jsonl `phase_s.<phase>.mean`); comm = "
             "`comm.time_s / steps`, the time the synchroniser's collectives took (with ddp it "
             "overlaps backward, so it is not a separate phase).", "",
             "| sync | world | data | forward | backward | sync | optim | step | comm | run |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['sync']} | {r['world_size']} | " + " | ".join(
            _f(r[f"{p}_ms"], ".3f") for p in (*PHASES, "step", "comm")) + f" | {short(r['run'])} |")
    return lines + [""]


# ----------------------------------------------------------------- bench runs
def bench_fits(runs: list[Run]) -> list[dict]:
    out = []
    for r in runs:
        if r.kind != "bench" or not r.ok:
            continue
        rows = r.bench.get("rows", [])
        primary = fit_alpha_beta(rows)
        impls = sorted({(x["impl"], x["group"]) for x in rows if x.get("op") == "all_reduce"})
        fits = [f for f in (fit_alpha_beta(rows, i, g) for i, g in impls) if f]
        out.append({"run": r, "primary": primary, "fits": fits})
    return out


def _match_fit(run: Run, fits: list[dict], short) -> tuple[Optional[Fit], str]:
    """The fit from the bench on the same allocation (world size, nodes, backend, device;
    real nodes before simulated ones, the latest run first); else the nearest world size
    on the same backend and device, named as such."""
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
        return best["primary"], f"same allocation: {short(str(best['run'].path))}"
    near = min(same, key=lambda f: abs((f["run"].world_size or 0) - n))
    return near["primary"], f"fit at world {near['run'].world_size}: {short(str(near['run'].path))}"


def comm_model_rows(runs: list[Run], fits: list[dict], short=str) -> list[dict]:
    rows = []
    for r in runs:
        if r.kind != "train" or not r.ok:
            continue
        fit, source = _match_fit(r, fits, short)
        comm = r.comm_per_step()
        ph = r.phase_ms()
        sync, n = r.get("sync", "?"), r.world_size or 1
        pred = predict_comm_s(sync, n, comm["payload_bytes"], comm["calls"], fit) if fit else None
        measured = comm["time_s"]
        rows.append({
            "run": str(r.path), "sync": sync, "world_size": n, "formula": formula(sync),
            "calls_per_step": comm["calls"],
            "payload_MB_per_step": comm["payload_bytes"] / 1e6 if comm["payload_bytes"] is not None else None,
            "predicted_ms": pred * 1e3 if pred is not None else None,
            "measured_comm_ms": measured * 1e3 if measured is not None else None,
            "sync_phase_ms": ph["sync"], "fit_source": source,
            "ratio": (measured / pred) if pred and measured else None,
        })
    rows.sort(key=lambda x: (x["sync"], x["world_size"], x["run"]))
    return rows


def comm_model_markdown(fits: list[dict], rows: list[dict], short) -> list[str]:
    lines = ["## Communication: alpha-beta model vs measured", "",
             "alpha = latency per message, beta = seconds per byte (1/beta = link bandwidth), "
             "fitted by least squares (weights 1/time) on each bench run's all_reduce time per "
             "call vs bytes, with the implementation's own cost model (torch modelled as ring: "
             "2(n-1)α + 2(n-1)/n·m·β). rel. RMS = how far the line is from the points.", ""]
    if not fits:
        lines += ["No completed bench run: run `python -m ddp_lab.bench` on the same allocation "
                  "to fit alpha and beta.", ""]
    else:
        lines += ["| bench run | allocation | impl (model) | group | n | alpha (µs) | beta (ns/B) | "
                  "1/beta (GB/s) | points | rel. RMS |", "|---|---|---|---|---|---|---|---|---|---|"]
        for f in fits:
            for fit in f["fits"]:
                mark = " (used)" if fit == f["primary"] else ""
                lines.append(
                    f"| {short(str(f['run'].path))} | {f['run'].bench['meta'].get('allocation', '?')} | "
                    f"{fit.impl} ({fit.algorithm}){mark} | {fit.group} | {fit.n} | "
                    f"{fit.alpha_s * 1e6:.1f} | {fit.beta_s_per_byte * 1e9:.3f} | "
                    f"{_f(fit.bandwidth_GBps)} | {fit.points} | {fit.rel_rms:.0%} |")
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
        for r in rows:
            lines.append(
                f"| {r['sync']} | {r['world_size']} | {r['formula']} | {_f(r['calls_per_step'], '.1f')} | "
                f"{_f(r['payload_MB_per_step'], '.3f')} | {_f(r['predicted_ms'], '.3f')} | "
                f"{_f(r['measured_comm_ms'], '.3f')} | {_f(r['sync_phase_ms'], '.3f')} | "
                f"{_f(r['ratio'], '.2f')} | {r['fit_source']} | {short(r['run'])} |")
        lines.append("")
    return lines


def bench_markdown(runs: list[Run], short) -> list[str]:
    benches = [r for r in runs if r.kind == "bench" and r.ok]
    if not benches:
        return []
    lines = ["## Collective benchmarks", "",
             "all_reduce peak bus bandwidth per bench run and series (GB/s = 1e9 bytes/s, "
             "nccl-tests' busbw); each bench run's own bench.md has every op and size.", "",
             "| bench run | allocation | op | impl | group | n | peak busbw (GB/s) | at elements | wrong |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in benches:
        alloc = r.bench.get("meta", {}).get("allocation", "?")
        series: dict[tuple, list[dict]] = {}
        for x in r.bench.get("rows", []):
            if x.get("op") != "all_reduce":
                continue
            series.setdefault((x["op"], x["impl"], x["group"]), []).append(x)
        for (op, impl, group), xs in series.items():
            good = [x for x in xs if x.get("correct")]
            best = max(good, key=lambda x: x["busbw_GBps"]) if good else None
            lines.append(
                f"| {short(str(r.path))} | {alloc} | {op} | {impl} | {group} | {xs[0]['group_size']} | "
                f"{_f(best['busbw_GBps'] if best else None)} | {pow2_label(best['elements']) if best else '–'} | "
                f"{len(xs) - len(good)} |")
    return lines + [""]


def segment_rows(runs: list[Run], short) -> list[dict[str, Any]]:
    """One row per allocation of every training run that used several (summary.json
    `segments`: a requeued SLURM job, a re-created pod, a resumed run)."""
    rows: list[dict[str, Any]] = []
    for r in runs:
        segs = r.summary.get("segments") if r.kind == "train" else None
        if not isinstance(segs, list) or len(segs) < 2:
            continue
        for i, seg in enumerate(s for s in segs if isinstance(s, dict)):
            wall = None
            try:
                wall = (datetime.datetime.fromisoformat(seg["end"])
                        - datetime.datetime.fromisoformat(seg["start"])).total_seconds()
            except (KeyError, TypeError, ValueError):
                pass
            rows.append({
                "run": short(str(r.path)), "segment": i + 1, "job_id": seg.get("job_id"),
                "restart": seg.get("restart"), "nodes": seg.get("nodes"),
                "hosts": ",".join(seg.get("hosts") or []), "start": seg.get("start"),
                "wall_s": wall, "from": _position(seg, "start"), "to": _position(seg, "end"),
                "steps_done": seg.get("steps_done"), "epochs_done": seg.get("epochs_done"),
                "epoch_time_s_median": seg.get("epoch_time_s_median"),
                "status": seg.get("status")})
    return rows


def _position(seg: dict, which: str) -> str:
    epoch, step = seg.get(f"{which}_epoch"), seg.get(f"{which}_step")
    if epoch is None:
        return "?"
    return f"epoch {epoch}" + (f" + {step} steps" if step else "")


def segments_markdown(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    def num(x, fmt):
        return "-" if x is None else format(x, fmt)
    lines = ["## Allocations of runs that used several", "",
             "One row per segment of summary.json: a SLURM requeue, a re-created pod or a "
             "resume starts a new one. Epoch time: the median of the epochs the segment "
             "finished (\"-\": it finished none).", "",
             "| run | # | job | restart | nodes | hosts | start | wall s | from | to | steps "
             "| epochs | epoch s | status |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(
            f"| `{row['run']}` | {row['segment']} | {row['job_id'] or '-'} | "
            f"{num(row['restart'], 'd')} | {num(row['nodes'], 'd')} | {row['hosts'] or '-'} | "
            f"{row['start'] or '-'} | {num(row['wall_s'], '.0f')} | {row['from']} | {row['to']} | "
            f"{num(row['steps_done'], 'd')} | {num(row['epochs_done'], 'd')} | "
            f"{num(row['epoch_time_s_median'], '.2f')} | {row['status'] or '-'} |")
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
