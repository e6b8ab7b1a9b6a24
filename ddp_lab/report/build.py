"""Assemble the report: tables, figures, files."""

from __future__ import annotations

import csv
import datetime
import json
import os
from pathlib import Path
from typing import Optional

from . import forecast as fcast
from . import plots, summary, tables, twins
from ..folder.files import atomic_open, atomic_write_text
from .run import Run, usable
from .tables import doctor_markdown, memory_markdown, memory_rows, segment_rows, segments_markdown
from .truth_table import witness_markdown, witness_rows


CSV_COLUMNS = ("sync", "device", "workload", "scaling", "global_batch", "nodes",
               "nproc_per_node", "world_size", "launcher", "backend", "epochs", "time_n",
               "epoch_time_s_mean", "epoch_time_s_std", "epoch_time_s_ci95_lo",
               "epoch_time_s_ci95_hi", "speedup", "speedup_ci95_lo", "speedup_ci95_hi",
               "efficiency", "efficiency_ci95_lo", "efficiency_ci95_hi", "comm_fraction",
               "comm_exposed_fraction", "samples_per_s", "test_accuracy", "baseline_world_size",
               "fingerprint_id", "baseline_fingerprint_id", "run", "runs")


def _csv_row(r: dict, device: str) -> dict:
    """A scaling row flat: intervals as _lo/_hi columns, repeats ;-joined."""
    out = {**r, "device": device, "runs": ";".join(r["runs"])}
    for k in ("epoch_time_s_ci95", "speedup_ci95", "efficiency_ci95"):
        out[f"{k}_lo"], out[f"{k}_hi"] = r.get(k) or (None, None)
    return out


def _shortener(runs: list[Run]):
    """Paths relative to the runs' common parent: tables stay narrow."""
    paths = [str(r.path) for r in runs]
    common = os.path.commonpath(paths) if len(paths) > 1 else str(Path(paths[0]).parent)

    def short(p: str) -> str:
        rel = os.path.relpath(p, common)
        return rel if rel != "." else Path(p).name

    return short, common


def vet(runs: list[Run], fits: list[dict], worlds: list[int], gpus_per_node: int,
        warmup: Optional[int]) -> None:
    """Each usable training run through every table alone first: one the
    report cannot use is set aside, with why, in the skipped list."""
    for r in usable(runs):
        try:
            groups = tables.scaling_groups([r], warmup)
            tables.phase_rows([r])
            tables.comm_model_rows([r], fits, str)
            fcast.forecast(groups, [r], fits, worlds, gpus_per_node, warmup)
        except Exception as e:  # noqa: BLE001 -- named in the report, never its end
            first = (str(e).strip().splitlines() or [""])[0]
            r.ok, r.status = False, f"the report cannot use it ({type(e).__name__}: {first})"


def warmup_words(groups: list[dict], warmup: Optional[int]) -> str:
    """What the terminal's times are: "after warm-up" only for the runs that left an epoch out."""
    left = [max(r["warmup_epochs"] or [0]) for g in groups for r in g["rows"]]
    first = "first epoch" if warmup in (None, 1) else f"first {warmup} epochs"
    if left and all(left):
        return f"each run's {first} left out as warm-up"
    if not any(left):
        return "every epoch counted: no run had more than " + \
            ("one" if warmup is None else str(warmup))
    return f"{first} left out as warm-up where a run had more; {left.count(0)} point(s) " \
        "count every epoch"


def build_report(runs: list[Run], out_dir: Path, make_plots: bool = True,
                 inputs: list[str] | None = None, warmup: Optional[int] = None,
                 forecast_worlds: Optional[list[int]] = None, gpus_per_node: int = 8) -> dict:
    """Write report.md, report.csv, report.json (+ PNGs) into out_dir; return the summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    short, common = _shortener(runs)
    fits = tables.bench_fits(runs)
    worlds = forecast_worlds or fcast.DEFAULT_WORLDS
    vet(runs, fits, worlds, gpus_per_node, warmup)
    groups = tables.scaling_groups(runs, warmup)
    phases = tables.phase_rows(runs)
    comm = tables.comm_model_rows(runs, fits, short)
    counts = tables.summary_counts(runs)
    segments = segment_rows(runs, short)
    memory = memory_rows(runs, short)
    fc = fcast.forecast(groups, runs, fits, worlds, gpus_per_node, warmup)
    show_fc = any(s["predictions"] or s["heldout"] for s in fc["series"])

    figures = []
    for name, make, data in (("epoch_time_vs_world.png", plots.epoch_time_figure, groups),
                             # a bar needs phase times (none with timing.enabled=false)
                             ("phases.png", plots.phase_figure,
                              [r for r in phases if r.get("step_ms") is not None]),
                             ("bench_all_reduce.png", plots.bench_figure, fits)):
        if make_plots and data:
            figures.append(plots.save(*make(data), out_dir / name))

    md = ["# ddp_lab report", "",
          f"{counts['train']} training run(s) and {counts['bench']} bench run(s) compared, "
          f"{counts['skipped']} folder(s) skipped; run folders under `{common}`; made "
          f"{datetime.datetime.now():%Y-%m-%d %H:%M}"
          + (f" by `python -m ddp_lab.report {' '.join(inputs)}`" if inputs else "") + ".", ""]
    for fig in figures:
        md += [f"![{fig['title']}]({fig['file']})", ""]
    md += tables.scaling_markdown(groups, short, warmup)
    if phases:
        md += tables.phase_markdown(phases, short)
    if fits or comm:
        md += tables.comm_model_markdown(fits, comm, short)
    if show_fc:
        md += fcast.forecast_markdown(fc)
    md += memory_markdown(memory)
    twin = twins.section(runs, out_dir, short, make_plots)
    md += twin["markdown"] + witness_markdown(runs, short) + segments_markdown(segments)
    md += tables.bench_markdown(runs, short) + doctor_markdown(runs)
    md += tables.skipped_markdown(runs, short)

    text = "\n".join(md).rstrip() + "\n"
    atomic_write_text(out_dir / "report.md", text)

    with atomic_open(out_dir / "report.csv") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(_csv_row(r, g["device"]) for g in groups for r in g["rows"])
    doc = {
        "scaling": groups, "forecast": fc, "phases": phases, "comm_model": comm, "segments": segments,
        "memory": memory, "twins": twin["doc"],
        "witnesses": [r for run in usable(runs) for r in witness_rows(run, short)],
        "fits": [{"run": str(f["run"].path), "primary": f["primary"].as_dict() if f["primary"] else None,
                  "all": [x.as_dict() for x in f["fits"]]} for f in fits],
        "bench_runs": [str(r.path) for r in usable(runs, "bench")],
        "skipped": [{"run": str(r.path), "kind": r.kind, "reason": r.status} for r in runs if not r.ok],
        "figures": [{k: f[k] for k in ("file", "title", "series")} for f in figures],
    }
    atomic_write_text(out_dir / "report.json", json.dumps(doc, indent=2, default=str) + "\n")
    warm = warmup_words(groups, warmup)
    screen = summary.terminal_summary(doc, counts, out_dir, common, warm) + twin["screen"]
    return {"markdown": text, "summary": screen, "counts": counts, "figures": figures, "doc": doc}
