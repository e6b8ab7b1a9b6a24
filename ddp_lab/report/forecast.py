"""Forecast time per epoch for worlds nobody ran, and check the forecast
honestly.

The model and its fit: forecast_fit.py. The honest check: per series,
fit on every world but the largest, predict the largest; a forecast is
shown only with that error, and called reliable only within TARGET
(`verdict`; docs/scaling.md, "Forecast").
"""

from __future__ import annotations

import math
from typing import Optional

from ..world.fingerprint import link_label
from .forecast_fit import fit_model, measured_point
from .run import Run
from .stats import sig

DEFAULT_WORLDS = [8, 16, 32, 64, 128, 256, 512, 1024]
# the forecast's goal: within 25% of a measured time per epoch
# (docs/scaling.md)
TARGET = 0.25


def forecast(groups: list[dict], runs: list[Run], bench: list[dict],
             worlds: list[int], gpus_per_node: int, warmup: Optional[int] = None) -> dict:
    """Per scaling series: the held-out check and the forecast for
    `worlds` (both modes)."""
    by_path = {str(r.path): r for r in runs}
    out = []
    for g in groups:
        members = [by_path[p] for row in g["rows"] for p in row["runs"] if p in by_path]
        if not members:
            continue
        first = members[0]
        pool = [r for r in runs if r.kind == "train" and r.ok and r.device_kind == first.device_kind
                and r.get("backend") == first.get("backend")]
        cap = int((first.config.get("train") or {}).get("max_steps_per_epoch") or 0)
        entry = {"sync": g["sync"], "device": g["device"], "workload": g["workload"],
                 "workload_short": g.get("workload_short", g["workload"]),
                 "scaling": first.scaling, "gpus_per_node": gpus_per_node}
        # honest check: fit on the smaller worlds, predict the largest
        # (of the allocation of the smallest world's first point, where
        # the largest world ran on it too)
        measured = sorted({row["world_size"] for row in g["rows"]})
        base_fid = g["rows"][0]["fingerprint_id"]
        entry["heldout"] = None
        if len(measured) >= 2:
            top = measured[-1]
            m, src = fit_model(members, pool, first.scaling, cap, bench, gpus_per_node, warmup,
                               max_world=measured[-2], fid=base_fid)
            tops = [x for x in g["rows"] if x["world_size"] == top]
            row = next((x for x in tops if x["fingerprint_id"] == base_fid), tops[0])
            top_run = by_path[row["run"]]
            p = measured_point(top_run, warmup)
            pred = m.predict(top, p.batch, top_run.get("nproc_per_node")) if m and p else None
            entry["heldout"] = {
                "fitted_worlds": measured[:-1], "predicted_world": top,
                "measured_s": row["epoch_time_s_mean"], "comm_fit": src,
                "predicted_s": pred["epoch_s"] if pred else None,
                "rel_error": (pred["epoch_s"] - row["epoch_time_s_mean"]) / row["epoch_time_s_mean"]
                if pred else None, "why_not": None if pred else src}
        models = {base_fid: fit_model(members, pool, first.scaling, cap, bench, gpus_per_node,
                                      warmup, fid=base_fid)}
        m, src = models[base_fid]
        entry["comm_fit"] = src
        if m is None:
            entry["predictions"], entry["fit"], entry["fit_check"] = [], None, []
            entry.update(verdict(entry))
            out.append(entry)
            continue
        # the fitted model against the very points it was fitted on,
        # each point with the comm fits of its own allocation (two link
        # rates: two predictions)
        entry["fit_check"] = []
        for row in g["rows"]:
            fid = row["fingerprint_id"]
            if fid not in models:
                models[fid] = fit_model(members, pool, first.scaling, cap, bench, gpus_per_node,
                                        warmup, fid=fid)
            m_row, src_row = models[fid]
            r = by_path.get(row["runs"][0])
            p = measured_point(r, warmup) if r else None
            pred = m_row.predict(row["world_size"], p.batch, r.get("nproc_per_node")) \
                if p and m_row else None
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
        preds = []
        for n in worlds:
            for mode, b in (("weak", weak_b), ("strong", strong_g / n)):
                p = m.predict(n, b)
                preds.append({"world": n, "nodes": math.ceil(n / gpus_per_node), "mode": mode,
                              "batch_per_rank": b, "global_batch": b * n,
                              **(p or {"epoch_s": None, "steps": None, "compute_ms": None,
                                       "comm_ms": None})})
        entry["predictions"] = preds
        entry.update(verdict(entry))
        out.append(entry)
    return {"worlds": worlds, "gpus_per_node": gpus_per_node, "series": out,
            "assumptions": ASSUMPTIONS, "target": TARGET}


def verdict(entry: dict) -> dict:
    """Whether a series' forecast may be shown, and in what words: only
    with a held-out error; `reliable` only where that error and the
    model's misses of the measured points it was fitted on are all
    within TARGET."""
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
    """' (fingerprint ID, link L, comm: SOURCE)': which allocation a
    fit_check line is (its comm fit named where it is not the series'
    `comm_fit`)."""
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
        for n in fc["worlds"]:
            w, st = by[(n, "weak")], by[(n, "strong")]
            lines.append(f"| {n} | {w['nodes']} | {sig(w['epoch_s'])} | {sig(w['comm_ms'])} | "
                         f"{sig(st['batch_per_rank'])} | {sig(st['epoch_s'])} | {sig(st['comm_ms'])} |")
        lines.append("")
    return lines
