"""Finding and reading run folders: training runs and bench runs,
complete or not.

A parent folder is searched recursively, never below a run folder (one
holding MARKERS), and a study folder is searched, never taken for a run.
Every folder found comes back: the ones that cannot be compared carry
the reason, so a report lists them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

from ..folder.records import EpochRecord, RunSummary, read_metrics
from ..folder.rundir import DRY_RUN, is_dry_run
from .run import Run

MARKERS = ("config.yaml", "summary.json", "metrics.jsonl")
# a study folder (ddp_lab.command.study): its run folders are in points/
STUDY_FILE = "study.json"


class ReportError(Exception):
    """A mistake in the report's input: printed as one line, no
    traceback."""


def _read_json(path: Path) -> tuple[Optional[dict], Optional[str]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return None, f"{path.name} is unreadable ({type(e).__name__}: {e})"
    if not isinstance(data, dict):
        return None, f"{path.name} is not a JSON object"
    return data, None


def _read_config(path: Path) -> dict:
    try:
        return OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    except Exception:  # noqa: BLE001 -- a garbled config only loses the fallbacks
        return {}


def _read_records(path: Path) -> tuple[list[EpochRecord], int]:
    # a torn line is skipped and counted
    lines, torn = read_metrics(path)
    records: list[EpochRecord] = []
    bad = len(torn)
    for line in lines:
        try:
            records.append(EpochRecord.from_dict(line))
        except ValueError:
            # a JSON object that is not an epoch record
            bad += 1
    return records, bad


def load_run(path: Path) -> Run:
    """Read one run folder and decide whether it can be compared, and if
    not, why."""
    config = _read_config(path / "config.yaml") if (path / "config.yaml").exists() else {}
    summary, err = ({}, None)
    if (path / "summary.json").exists():
        summary, err = _read_json(path / "summary.json")
        summary = summary or {}
    is_bench = "bench" in config or summary.get("kind") == "bench" or (path / "bench.json").exists()
    if is_bench:
        return _load_bench(path, config, summary, err)
    records, bad = _read_records(path / "metrics.jsonl")
    typed = RunSummary.from_dict(summary) if summary else None
    run = Run(path, "train", False, "", typed.to_dict() if typed else {}, config, records)
    dry = bool((config.get("launcher") or {}).get("dry_run"))
    epochs = run.get("epochs")
    if err:
        run.status = err
    elif not summary:
        if dry:
            run.status = "dry run: nothing was started"
        elif records:
            run.status = (f"incomplete: {len(records)} of {epochs} epoch(s) logged and no "
                          "summary.json (still running, or killed)")
        else:
            run.status = "incomplete: no summary.json, no metrics (never started, still running, or killed)"
    elif typed.records_kept is False:
        # a run.entry of its own (ddp_lab.rank.one_file)
        run.status = (f"{typed.status}: run.entry={typed.entry} keeps no records (no metrics.jsonl), "
                      "so it has no figures to compare")
    elif typed.status != "completed":
        run.status = str(typed.status or "no status in summary.json")
    elif typed.epoch_time_s_median is None:
        run.status = "completed but no epoch was timed (a resumed run that had already finished)"
    else:
        run.ok, run.status = True, "completed"
        if bad:
            run.status = f"completed ({bad} unreadable metrics line(s) ignored)"
    return run


def _load_bench(path: Path, config: dict, summary: dict, err: Optional[str]) -> Run:
    run = Run(path, "bench", False, "", summary, config)
    if err:
        run.status = err
        return run
    if not summary:
        dry = bool((config.get("launcher") or {}).get("dry_run"))
        run.status = "dry run: nothing was started" if dry else \
            "incomplete: no summary.json (still running, or killed)"
        return run
    status = str(summary.get("status") or "no status in summary.json")
    if not status.startswith("completed"):
        run.status = status
        return run
    doc, err = _read_json(path / "bench.json") if (path / "bench.json").exists() else \
        (None, "bench.json is missing")
    if doc is None:
        run.status = err or "bench.json is missing"
        return run
    run.bench, run.ok, run.status = doc, True, status
    return run


def find_runs(paths: list[str | Path], exclude: Optional[Path] = None) -> list[Run]:
    """Every run folder at or under `paths` (a list of folders), each
    once, sorted by path."""
    found: dict[Path, None] = {}
    dry = 0  # dry runs' folders, left out
    for p in paths:
        root = Path(p).expanduser()
        if not root.exists():
            raise ReportError(f"{p}: no such file or folder")
        if not root.is_dir():
            raise ReportError(f"{p}: not a folder (give run folders, or a folder holding them)")
        root = root.resolve()
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            # our own output
            if exclude is not None and here == exclude and here != root:
                dirnames[:] = []
                continue
            # a study folder: its points are runs, it is not
            if STUDY_FILE in filenames:
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            elif DRY_RUN in filenames and is_dry_run(here):
                # rendered, never started
                dry += 1
                dirnames[:] = []
            elif any(m in filenames for m in MARKERS):
                found[here] = None
                # tb/, checkpoints/, logs/, plots/ of a run: not runs
                dirnames[:] = []
            else:
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    if not found and dry:
        raise ReportError(
            f"{', '.join(map(str, paths))} holds only dry runs ({dry}): rendered, never started; "
            "run the same command without launcher.dry_run=true")
    if not found:
        raise ReportError(
            f"no run folders under {', '.join(map(str, paths))}: a run folder holds config.yaml "
            "or summary.json, as `python -m ddp_lab` and `python -m ddp_lab.bench` make")
    return [load_run(p) for p in sorted(found)]

