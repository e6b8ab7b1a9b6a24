"""The report in one screen, what `python -m ddp_lab.report` prints: time
per epoch, a block per workload (the largest first), the forecasts'
verdicts and the notes; at most MAX_LINES lines, the rest counted.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path

from .tables import ci_cell, MIN_REPEATS, sig, workload_titles
from .truth_table import disagreement, TARGET_MODEL


MAX_LINES = 40  # one terminal screen
WIDTH = 100
# at most, of the forecasts' verdicts, the notes, the witnesses' misses
FORECAST_LINES, NOTE_LINES, WITNESS_LINES = 6, 10, 6


def _columns(rows: list[list[str]]) -> list[str]:
    """Rows of cells as left-aligned columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths))).rstrip() for r in rows]


def _wrap(text: str, indent: str = "  ") -> list[str]:
    """One entry wrapped to WIDTH columns, its later lines indented."""
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")


def _capped(entries: list[list[str]], most: int, rest: str) -> list[str]:
    """Whole entries while they fit in `most` lines, then a line counting the rest."""
    out: list[str] = []
    for i, e in enumerate(entries):
        # keep a line for the "more"
        room = most - (1 if i < len(entries) - 1 else 0)
        if len(out) + len(e) > room:
            return out + [f"  ... {len(entries) - i} more {rest} in report.md"]
        out += e
    return out


def _efficiency(r: dict) -> str:
    if r["efficiency"] is None or r["run"] == r["baseline_run"]:
        return "–" if r["efficiency"] is None else "baseline"
    ci = r["efficiency_ci95"]
    return f"{r['efficiency']:.0%}" + (f" [{ci[0]:.0%}, {ci[1]:.0%}]" if ci else "") \
        + (" ⚠" if r["cross_fingerprint"] else "")


def scaling_lines(groups: list[dict], budget: int) -> list[str]:
    """One table, its header once: per workload (the most points first) a heading, then a
    row per point; within `budget` lines, the rest counted in a last line."""
    keys = list(dict.fromkeys((g["device"], g["workload"]) for g in groups))
    titles = workload_titles(groups, keys)
    blocks = []
    for key in keys:
        rows = [[g["sync"], str(r["world_size"]), f"{r['nodes']}x{r['nproc_per_node']}",
                 str(r["time_n"]), sig(r["epoch_time_s_mean"]),
                 ci_cell(r["epoch_time_s_ci95"], r["time_n"], sig), _efficiency(r)]
                for g in groups if (g["device"], g["workload"]) == key for r in g["rows"]]
        blocks.append((f"{key[0]} · {titles[key]}" if key[0] not in titles[key] else titles[key], rows))
    # stable: equal sizes keep the report's order
    blocks.sort(key=lambda b: -len(b[1]))
    head = ["sync", "world", "nodes x procs", "n", "epoch (s)", "95% CI (s)", "efficiency (95% CI)"]
    table = _columns([head] + [r for _, rs in blocks for r in rs])
    lines, at = [table[0]], 1
    hidden_points = hidden_workloads = 0
    for title, rows in blocks:
        cells = table[at:at + len(rows)]
        at += len(rows)
        # the heading's line, and one for what is left out unless last
        room = budget - len(lines) - 1 - (0 if at == len(table) else 1)
        if not hidden_points and len(rows) <= room:
            lines += [textwrap.shorten(title, WIDTH), *cells]
            continue
        shown = room - 1 if not hidden_points and len(lines) == 1 else 0
        # the largest workload alone overflows the screen: its first rows
        if shown > 0:
            lines += [textwrap.shorten(title, WIDTH), *cells[:shown]]
        else:
            hidden_workloads += 1
        hidden_points += len(rows) - max(shown, 0)
    if hidden_points:
        lines.append(f"  ... {hidden_points} more point(s)"
                     + (f" of {hidden_workloads} more workload(s)" if hidden_workloads else "")
                     + " in report.md")
    return lines


def forecast_lines(fc: dict) -> list[str]:
    """A shown forecast's verdict on its own line (weak-scaling numbers where reliable); those
    without one grouped by the reason."""
    series = [s for s in fc["series"] if s["heldout"] is not None or s["predictions"]]
    # one world size and no model: nothing was to be forecast
    if not series:
        return []
    keys = list(dict.fromkeys((s["device"], s["workload"]) for s in series))
    titles = workload_titles(series, keys)

    def name(s: dict) -> str:
        return s["sync"] + (f" · {titles[(s['device'], s['workload'])]}" if len(keys) > 1 else "")

    entries, silent = [], {}
    for s in series:
        if not s["shown"]:
            silent.setdefault(s["why"], []).append(s)
        elif not s["reliable"]:
            entries.append(_wrap(f"{name(s)}: UNRELIABLE: {s['why']}"))
        else:
            weak = [p for p in s["predictions"] if p["mode"] == "weak" and p["epoch_s"] is not None]
            picks = weak if len(weak) <= 3 else [weak[0], weak[len(weak) // 2], weak[-1]]
            entries.append(_wrap(f"{name(s)}: {s['why']}; weak scaling: " + ", ".join(
                f"{p['world']} ranks {sig(p['epoch_s'])} s" for p in picks)))
    for why, ss in silent.items():
        if len(ss) == 1:
            entries.append(_wrap(f"{name(ss[0])}: no forecast: {why}"))
        else:
            syncs = len({s["sync"] for s in ss})
            wl = len({(s["device"], s["workload"]) for s in ss})
            entries.append(_wrap(f"no forecast for {len(ss)} series ({syncs} sync(s) on {wl} "
                                 f"workload(s)): {why}"))
    return ["", "Forecast of the time per epoch (report.md: the model, every world):",
            *_capped(entries, FORECAST_LINES, "forecast verdict(s)")]


def comm_model_note(comm: list[dict]) -> str | None:
    """Where the alpha-beta model misses the measured comm: what it means, what to try."""
    ratios = [r["ratio"] for r in comm if r.get("ratio")]
    if not ratios or all(abs(x - 1) <= TARGET_MODEL for x in ratios):
        return None
    lo, hi = f"{min(ratios):.1f}x", f"{max(ratios):.1f}x"
    why = []
    if max(ratios) > 1 + TARGET_MODEL:
        why.append("slower than the model: in training a rank also waits for a later one and "
                   "shares its cores with compute, the bench times each call alone")
    if min(ratios) < 1 - TARGET_MODEL:
        why.append("faster: ddp's buckets overlap backward, or the fit's line misses small calls")
    # the advice only where a run is priced by another allocation's bench
    own = all(r.get("fit_source", "").startswith("same allocation") for r in comm if r.get("ratio"))
    advice = ("the bench is the runs' own allocation already, so the gap is training's, not "
              "the fit's" if own else
              "try a bench on the runs' own allocation (same nodes x procs)")
    return (f"comm model: measured comm per step is {lo if lo == hi else f'{lo}-{hi}'} the "
            f"alpha-beta prediction (target: within {TARGET_MODEL:.0%}), so forecasts built on "
            f"it miss as much; {'; '.join(why)}. {advice[0].upper() + advice[1:]}; report.md, "
            "\"Communication\", prices each run")


def note_lines(groups: list[dict], comm: list[dict], skipped: list[dict]) -> list[str]:
    """What changes how the table reads (too few repeats, capped epochs, other fingerprints,
    the comm model's miss, skipped folders), each said once."""
    notes = []
    few = sum(r["time_n"] < MIN_REPEATS for g in groups for r in g["rows"])
    if few:
        notes.append(f"{few} point(s) with n < {MIN_REPEATS} repeats: no interval, it would not be "
                     f"meaningful (a study: study.repeats={MIN_REPEATS} or more)")
    capped = {g["workload_short"] for g in groups if "steps/epoch" in g["workload_short"]
              and g.get("scaling") != "strong" and len({r["world_size"] for r in g["rows"]}) > 1}
    if capped:
        notes.append(f"{', '.join(sorted({c.split(', ')[-1] for c in capped}))}: the step cap is per "
                     "rank, so an epoch's work grows with the world; efficiency counts the work "
                     "(100% = the baseline's time per epoch)")
    notes += [f"⚠ {k} row(s) set against a world of another allocation, whose fingerprint "
              f"differs: {what} (report.md names them)"
              for what, k in Counter(d for g in groups for d in g.get("fingerprint_differences", [])).items()]
    model = comm_model_note(comm)
    if model:
        notes.append(model)
    # what the report left out comes first: the cap never hides it
    left_out = [f"skipped {Path(s['run']).name}: "
                + textwrap.shorten(s["reason"], 100, placeholder=" …") for s in skipped[:3]]
    if len(skipped) > 3:
        left_out.append(f"... and {len(skipped) - 3} more skipped folder(s), in report.md")
    notes = left_out + notes
    return ["", "Notes:", *_capped([_wrap(f"- {n}", "") for n in notes], NOTE_LINES, "note(s)")] \
        if notes else []


def witness_lines(rows: list[dict]) -> list[str]:
    """Each witnessed figure outside its band on a line; else one line saying they agree."""
    judged = [r for r in rows if r["agrees"] is not None]
    bad = [r for r in judged if r["agrees"] is False]
    if not judged:
        return []
    if not bad:
        return ["", f"Independent witnesses: {len(judged)} figure(s) of {len({r['run'] for r in judged})} "
                    "profiled run(s), every rank within its band (report.md)"]
    return ["", f"Independent witnesses: {len(bad)} of {len(judged)} figure(s) outside the band "
                "docs/timing.md states:",
            *_capped([[f"  {disagreement(r)}"] for r in bad], WITNESS_LINES, "disagreement(s)")]


def terminal_summary(doc: dict, counts: dict, out_dir: Path, common: str,
                     warmup_text: str) -> str:
    """The screen from report.json's `doc` in MAX_LINES lines: the table gets what is left."""
    head = [f"{counts['train']} training run(s), {counts['bench']} bench run(s), "
            f"{counts['skipped']} skipped, under {common}", ""]
    tail = forecast_lines(doc["forecast"]) + witness_lines(doc.get("witnesses") or []) \
        + note_lines(doc["scaling"], doc["comm_model"], doc["skipped"])
    if doc["figures"]:
        tail += ["", "Plots:", *(f"  {out_dir / f['file']}" for f in doc["figures"])]
    tail += ["", f"Full report: {out_dir / 'report.md'}"]
    if doc["scaling"]:
        body = textwrap.wrap(f"Time per epoch, mean of n repeats ({warmup_text}):", WIDTH)
        body += scaling_lines(doc["scaling"], MAX_LINES - len(head) - len(tail) - 1)
    else:
        body = ["No completed training run to compare."]
    return "\n".join(head + body + tail) + "\n"
