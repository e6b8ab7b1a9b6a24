"""The report in one screen: what `python -m ddp_lab.report` prints; report.md has the rest.

The main question first -- time per epoch per world size and allocation, one table per
workload --, then each forecast's verdict, the notes that change how the numbers read,
and where the plots and the full report are.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from .stats import MIN_REPEATS, sig
from .tables import ci_cell, workload_titles
from .truth import TARGET_MODEL


def _columns(rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Rows of cells as left-aligned columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths))).rstrip() for r in rows]


def _wrap(text: str, indent: str = "  ") -> list[str]:
    """One entry wrapped to 100 columns, its later lines indented under its first."""
    return textwrap.wrap(text, 100, initial_indent=indent, subsequent_indent=indent + "  ")


def _efficiency(r: dict) -> str:
    if r["efficiency"] is None:
        return "–"
    if r["run"] == r["baseline_run"]:
        return "baseline"
    ci = r["efficiency_ci95"]
    return f"{r['efficiency']:.0%}" + (f" [{ci[0]:.0%}, {ci[1]:.0%}]" if ci else "") \
        + (" ⚠" if r["cross_fingerprint"] else "")


def scaling_lines(groups: list[dict]) -> list[str]:
    """One table per workload: sync, world, nodes x procs, n, mean time, interval, efficiency."""
    keys = list(dict.fromkeys((g["device"], g["workload"]) for g in groups))
    titles = workload_titles(groups, keys)
    lines = []
    for key in keys:
        rows = [["sync", "world", "nodes x procs", "n", "epoch (s)", "95% CI (s)", "efficiency (95% CI)"]]
        for g in (g for g in groups if (g["device"], g["workload"]) == key):
            for r in g["rows"]:
                rows.append([g["sync"], str(r["world_size"]), f"{r['nodes']}x{r['nproc_per_node']}",
                             str(r["time_n"]), sig(r["epoch_time_s_mean"]),
                             ci_cell(r["epoch_time_s_ci95"], r["time_n"], sig), _efficiency(r)])
        lines += ["", f"{key[0]} · {titles[key]}" if key[0] not in titles[key] else titles[key]]
        lines += _columns(rows)
    return lines


def forecast_lines(fc: dict) -> list[str]:
    """One line per series: its verdict; the weak-scaling numbers only where reliable."""
    out = []
    several = len({(s["device"], s["workload"]) for s in fc["series"]}) > 1
    for s in fc["series"]:
        if s["heldout"] is None and not s["predictions"]:
            continue  # one world size and no model: nothing was to be forecast
        head = s["sync"] + (f" · {s['workload_short']}" if several else "") + ": "
        if not s["shown"]:
            out += _wrap(head + f"no forecast: {s['why']}")
        elif not s["reliable"]:
            out += _wrap(head + f"UNRELIABLE: {s['why']}")
        else:
            weak = [p for p in s["predictions"] if p["mode"] == "weak" and p["epoch_s"] is not None]
            picks = weak if len(weak) <= 3 else [weak[0], weak[len(weak) // 2], weak[-1]]
            out += _wrap(head + f"{s['why']}; weak scaling: " + ", ".join(
                f"{p['world']} ranks {sig(p['epoch_s'])} s" for p in picks))
    return ["", "Forecast of the time per epoch (report.md: the model, every world):", *out] if out else []


def note_lines(groups: list[dict], comm: list[dict], skipped: list[dict]) -> list[str]:
    """What changes how the table reads: too few repeats, capped epochs, points compared
    across fingerprints, a comm model far from the measurement, skipped folders."""
    notes = []
    few = sum(r["time_n"] < MIN_REPEATS for g in groups for r in g["rows"])
    if few:
        notes.append(f"{few} point(s) with n < {MIN_REPEATS} repeats: no interval, it would not be "
                     f"meaningful (a study: study.repeats={MIN_REPEATS} or more)")
    capped = {g["workload_short"] for g in groups if "steps/epoch" in g["workload_short"]
              and g.get("scaling") != "strong" and len({r["world_size"] for r in g["rows"]}) > 1}
    if capped:
        notes.append(f"{', '.join(sorted(c.split(', ')[-1] for c in capped))}: the step cap is per "
                     "rank, so an epoch's work grows with the world; efficiency counts the work "
                     "(100% = the baseline's time per epoch)")
    notes += [f"⚠ {n}" for g in groups for n in g["fingerprint_notes"]]
    ratios = [r["ratio"] for r in comm if r.get("ratio")]
    if ratios and any(abs(x - 1) > TARGET_MODEL for x in ratios):
        lo, hi = f"{min(ratios):.1f}x", f"{max(ratios):.1f}x"
        span = lo if lo == hi else f"{lo}-{hi}"
        notes.append(f"comm model: measured comm per step is {span} "
                     f"the alpha-beta prediction (target: within {TARGET_MODEL:.0%}); report.md, "
                     "\"Communication\"")
    for s in skipped[:3]:
        notes.append(f"skipped {Path(s['run']).name}: "
                     + textwrap.shorten(s["reason"], 100, placeholder=" …"))
    if len(skipped) > 3:
        notes.append(f"... and {len(skipped) - 3} more skipped folder(s), in report.md")
    return ["", "Notes:", *(line for n in notes for line in _wrap(f"- {n}", ""))] if notes else []


def terminal_summary(doc: dict, counts: dict, out_dir: Path, common: str,
                     warmup_text: str) -> str:
    """The screen `python -m ddp_lab.report` prints (report.json's `doc` as input)."""
    lines = [f"{counts['train']} training run(s), {counts['bench']} bench run(s), "
             f"{counts['skipped']} skipped, under {common}"]
    if doc["scaling"]:
        lines += ["", f"Time per epoch, mean of n repeats ({warmup_text}):"]
        lines += scaling_lines(doc["scaling"])
    else:
        lines += ["", "No completed training run to compare."]
    lines += forecast_lines(doc["forecast"])
    lines += note_lines(doc["scaling"], doc["comm_model"], doc["skipped"])
    if doc["figures"]:
        lines += ["", "Plots:", *(f"  {out_dir / f['file']}" for f in doc["figures"])]
    lines += ["", f"Full report: {out_dir / 'report.md'}"]
    return "\n".join(lines) + "\n"
