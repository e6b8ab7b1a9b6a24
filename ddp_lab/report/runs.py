"""Finding and reading run folders: training runs and bench runs, complete or not.

A run folder is any folder holding `config.yaml`, `summary.json` or `metrics.jsonl` (what
`python -m ddp_lab` and `python -m ddp_lab.bench` make); a parent folder is searched
recursively, never below a run folder. Every folder found comes back, usable or not: the
ones that cannot be compared carry the reason, so a report lists them instead of
silently dropping them. A training run's metrics.jsonl and summary.json are read through
the trainer's own record types (`ddp_lab.records`), so files written before versioning
read as well.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..records import EpochRecord, RunSummary

MARKERS = ("config.yaml", "summary.json", "metrics.jsonl")
PHASES = ("data", "forward", "backward", "sync", "optim")


class ReportError(Exception):
    """A mistake in the report's input: printed as one line, no traceback."""


@dataclass
class Run:
    path: Path
    kind: str  # train | bench
    ok: bool  # usable for comparison
    status: str  # "completed" or why not
    summary: dict = field(default_factory=dict)  # summary.json (a training run's: RunSummary's keys)
    config: dict = field(default_factory=dict)
    records: list[EpochRecord] = field(default_factory=list)  # metrics.jsonl, one per epoch
    bench: Optional[dict] = None  # bench.json

    # -------------------------------------------------------------- shared fields
    def get(self, key: str, default: Any = None) -> Any:
        """From summary.json, else from the config (launcher/sync sections), else default."""
        if self.summary.get(key) is not None:
            return self.summary[key]
        cfg = self.config
        fallback = {
            "launcher": (cfg.get("launcher") or {}).get("name"),
            "sync": (cfg.get("sync") or {}).get("name"),
            "nodes": (cfg.get("launcher") or {}).get("nodes"),
            "nproc_per_node": (cfg.get("launcher") or {}).get("nproc_per_node"),
            "epochs": (cfg.get("train") or {}).get("epochs"),
        }.get(key)
        return default if fallback is None else fallback

    @property
    def world_size(self) -> Optional[int]:
        ws = self.summary.get("world_size")
        if ws is None and self.get("nodes") and self.get("nproc_per_node"):
            ws = self.get("nodes") * self.get("nproc_per_node")
        return ws

    @property
    def device_kind(self) -> str:
        """What runs must share to be compared: "cpu" (however it is spelled: cpu, CPU,
        cpu:0; or dist.device=cpu in the config of a run without a summary), else the GPU's
        name as the run recorded it."""
        d = self.get("device")
        if d is None:
            d = (self.config.get("dist") or {}).get("device")
        d = str(d or "?")
        return "cpu" if d.split(":")[0].strip().lower() == "cpu" else d

    # ------------------------------------------------------------- training runs
    @property
    def workload(self) -> tuple:
        """What must match for epoch times to be comparable: (model, batch, per-epoch step
        cap (0 = the whole shard)). batch is a string: "global 64" for strong scaling
        (train.global_batch: the same for every world size, so its runs on 1, 2, 4 ...
        ranks group together), "64/rank" for weak scaling; ", micro 16" is added where
        train.micro_batch limits the samples per forward/backward."""
        train = self.config.get("train") or {}
        model = (self.config.get("model") or {}).get("name", self.summary.get("model"))
        global_batch = train.get("global_batch") or (
            self.summary.get("global_batch") if self.summary.get("scaling") == "strong" else 0)
        if global_batch:
            batch = f"global {global_batch}"
        else:
            batch = f"{train.get('batch_size', self.summary.get('batch_size'))}/rank"
        micro = train.get("micro_batch") or 0
        if micro:
            batch += f", micro {micro}"
        return (model, batch, train.get("max_steps_per_epoch", 0))

    def workload_label(self) -> str:
        model, batch, steps = self.workload
        cap = f", {steps} steps/epoch" if steps else ", full epochs"
        what = f"global batch {batch.removeprefix('global ')}" if batch.startswith("global") \
            else f"batch {batch}"
        return f"{model}, {what}{cap}"

    def samples_per_s(self) -> Optional[float]:
        """Median training throughput over epochs (metrics.jsonl `samples_per_s`)."""
        return median_or_none([r.samples_per_s for r in self.records])

    def steps_total(self) -> int:
        return sum(int(r.steps or 0) for r in self.records)

    def phase_ms(self) -> dict[str, Optional[float]]:
        """Mean ms per step of each phase (and the whole step), over every epoch."""
        out: dict[str, Optional[float]] = {}
        for p in (*PHASES, "step"):
            num = den = 0.0
            for r in self.records:
                ph = (r.phase_s or {}).get(p)
                steps = r.steps or 0
                if ph and steps:
                    num += ph.get("mean", 0.0) * steps
                    den += steps
            out[p] = 1e3 * num / den if den else None
        return out

    def comm_per_step(self) -> dict[str, Optional[float]]:
        """Measured comm per step: seconds (comm.time_s / steps), payload bytes and calls."""
        steps = self.steps_total()
        if not steps:
            return {"time_s": None, "payload_bytes": None, "calls": None}
        tot = {k: sum(float((r.comm or {}).get(k) or 0.0) for r in self.records)
               for k in ("time_s", "payload_bytes", "calls")}
        return {k: v / steps for k, v in tot.items()}


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
        from omegaconf import OmegaConf

        return OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    except Exception:  # noqa: BLE001 -- a garbled config only loses the fallbacks
        return {}


def _read_records(path: Path) -> tuple[list[EpochRecord], int]:
    records: list[EpochRecord] = []
    bad = 0
    if not path.exists():
        return records, bad
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            records.append(EpochRecord.from_dict(json.loads(line)))
        except ValueError:
            bad += 1  # a line cut short by a killed run (older writers), or not a record
    return records, bad


def load_run(path: Path) -> Run:
    """Read one run folder and decide whether it can be compared, and if not, why."""
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
    """Every run folder at or under `paths` (a list of folders), each once, sorted by path."""
    found: dict[Path, None] = {}
    for p in paths:
        root = Path(p).expanduser()
        if not root.exists():
            raise ReportError(f"{p}: no such file or folder")
        if not root.is_dir():
            raise ReportError(f"{p}: not a folder (give run folders, or a folder holding them)")
        root = root.resolve()
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            if exclude is not None and here == exclude and here != root:  # our own output
                dirnames[:] = []
                continue
            if any(m in filenames for m in MARKERS):
                found[here] = None
                dirnames[:] = []  # tb/, checkpoints/, logs/, plots/ of a run: not runs
            else:
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    if not found:
        raise ReportError(
            f"no run folders under {', '.join(map(str, paths))}: a run folder holds config.yaml "
            "or summary.json, as `python -m ddp_lab` and `python -m ddp_lab.bench` make")
    return [load_run(p) for p in sorted(found)]


def median_or_none(values: list[float]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
