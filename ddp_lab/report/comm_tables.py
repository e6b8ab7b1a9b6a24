"""The communication tables: alpha-beta fits of the bench runs
(report/alpha_beta.py's), each training run's predicted comm per step
against the measured, the bench's peak busbw.
"""

from __future__ import annotations

from typing import Optional

from ..predict.costmodel import pow2_label
from .alpha_beta import Fits, fit_all, fit_alpha_beta, formula, predict_comm_s
from .run import Run
# a number in a cell, "–" for none: every table writes them alike
from .tables import _f


def bench_fits(runs: list[Run]) -> list[dict]:
    out = []
    for r in runs:
        if r.kind != "bench" or not r.ok:
            continue
        rows = r.bench.get("rows", [])
        primary = fit_alpha_beta(rows)
        impls = sorted({(x["impl"], x["group"]) for x in rows if x.get("op") == "all_reduce"})
        fits = [f for f in (fit_alpha_beta(rows, i, g) for i, g in impls) if f]
        # what predictions use: one fit per collective and
        # implementation (report/alpha_beta.py)
        out.append({"run": r, "primary": primary, "fits": fits, "by_op": fit_all(rows)})
    return out


def _match_fit(run: Run, fits: list[dict], short) -> tuple[Optional[Fits], str]:
    """The fit from the bench on the same allocation (world size, nodes,
    backend, device; real nodes before simulated ones, the latest run
    first); else the nearest world size on the same backend and device,
    named as such."""
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
                lines.append(
                    f"| {short(str(f['run'].path))} | {f['run'].bench['meta'].get('allocation', '?')} | "
                    f"{op}{fit.impl} ({fit.algorithm}){mark} | {fit.group} | {fit.n} | "
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
