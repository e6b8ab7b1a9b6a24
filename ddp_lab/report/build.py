"""Assemble the report: tables, figures, files."""

from __future__ import annotations

import csv
import datetime
import json
import os
from pathlib import Path

from . import plots, tables
from .runs import Run

CSV_COLUMNS = ("sync", "device", "workload", "nodes", "nproc_per_node", "world_size",
               "launcher", "backend", "epochs", "epoch_time_s_median", "speedup", "efficiency",
               "comm_fraction", "samples_per_s", "test_accuracy", "baseline_world_size", "run")


def _shortener(runs: list[Run]):
    """Paths relative to the runs' common parent: tables stay narrow."""
    paths = [str(r.path) for r in runs]
    common = os.path.commonpath(paths) if len(paths) > 1 else str(Path(paths[0]).parent)

    def short(p: str) -> str:
        rel = os.path.relpath(p, common)
        return rel if rel != "." else Path(p).name

    return short, common


def build_report(runs: list[Run], out_dir: Path, make_plots: bool = True,
                 inputs: list[str] | None = None) -> dict:
    """Write report.md, report.csv, report.json (+ PNGs) into out_dir; return the summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    short, common = _shortener(runs)
    groups = tables.scaling_groups(runs)
    phases = tables.phase_rows(runs)
    fits = tables.bench_fits(runs)
    comm = tables.comm_model_rows(runs, fits, short)
    counts = tables.summary_counts(runs)
    segments = tables.segment_rows(runs, short)

    figures = []
    if make_plots:
        if groups:
            figures.append(plots.epoch_time_vs_world(groups, out_dir / "epoch_time_vs_world.png"))
        if phases:
            figures.append(plots.phase_bars(phases, out_dir / "phases.png"))
        if fits:
            figures.append(plots.bench_compare(fits, out_dir / "bench_all_reduce.png"))

    md = ["# ddp_lab report", "",
          f"{counts['train']} training run(s) and {counts['bench']} bench run(s) compared, "
          f"{counts['skipped']} folder(s) skipped; run folders under `{common}`; made "
          f"{datetime.datetime.now():%Y-%m-%d %H:%M}"
          + (f" by `python -m ddp_lab.report {' '.join(inputs)}`" if inputs else "") + ".", ""]
    for fig in figures:
        md += [f"![{fig['title']}]({fig['file']})", ""]
    md += tables.scaling_markdown(groups, short)
    if phases:
        md += tables.phase_markdown(phases, short)
    if fits or comm:
        md += tables.comm_model_markdown(fits, comm, short)
    md += tables.segments_markdown(segments)
    md += tables.bench_markdown(runs, short)
    md += tables.skipped_markdown(runs, short)
    text = "\n".join(md).rstrip() + "\n"
    (out_dir / "report.md").write_text(text)

    with open(out_dir / "report.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for g in groups:
            for r in g["rows"]:
                w.writerow({**r, "device": g["device"]})
    doc = {
        "scaling": groups, "phases": phases, "comm_model": comm, "segments": segments,
        "fits": [{"run": str(f["run"].path), "primary": f["primary"].as_dict() if f["primary"] else None,
                  "all": [x.as_dict() for x in f["fits"]]} for f in fits],
        "bench_runs": [str(r.path) for r in runs if r.kind == "bench" and r.ok],
        "skipped": [{"run": str(r.path), "kind": r.kind, "reason": r.status} for r in runs if not r.ok],
        "figures": [{k: f[k] for k in ("file", "title", "series")} for f in figures],
    }
    (out_dir / "report.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return {"markdown": text, "counts": counts, "figures": figures, "doc": doc}
