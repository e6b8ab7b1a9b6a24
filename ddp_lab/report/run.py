"""One run folder as the report reads it: `Run`, its files and figures."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from ..folder.description import describe_run, Description, plural
from ..folder.records import EpochRecord, read_metrics, RunSummary
from ..folder.rundir import DRY_RUN, is_dry_run


PHASES = ("data", "forward", "backward", "sync", "optim")
#: Run.get's fallbacks: a key summary.json lacks, read from (config section, key)
CONFIG_KEYS = {"launcher": ("launcher", "name"), "sync": ("sync", "name"),
               "nodes": ("launcher", "nodes"), "nproc_per_node": ("launcher", "nproc_per_node"),
               "epochs": ("train", "epochs")}


@dataclass
class Run:
    path: Path
    kind: str  # train | bench
    ok: bool  # usable for comparison
    status: str  # "completed" or why not
    # summary.json (a training run's: RunSummary's keys)
    summary: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    # metrics.jsonl, one per epoch
    records: list[EpochRecord] = field(default_factory=list)
    bench: Optional[dict] = None  # bench.json

    def get(self, key: str, default: Any = None) -> Any:
        """From summary.json, else from the config (CONFIG_KEYS), else default."""
        if self.summary.get(key) is not None:
            return self.summary[key]
        section, name = CONFIG_KEYS.get(key, ("", ""))
        fallback = self.cfg(section).get(name)
        return default if fallback is None else fallback

    def cfg(self, section: str) -> dict:
        """One section of config.yaml ({} where it has none)."""
        return self.config.get(section) or {}

    @property
    def world_size(self) -> Optional[int]:
        ws = self.summary.get("world_size")
        if ws is None and self.get("nodes") and self.get("nproc_per_node"):
            ws = self.get("nodes") * self.get("nproc_per_node")
        return ws

    @property
    def device_kind(self) -> str:
        """What runs must share to be compared: "cpu" (however spelled, or
        the config's dist.device), else the GPU's name as recorded."""
        d = str(self.get("device", self.cfg("dist").get("device")) or "?")
        return "cpu" if d.split(":")[0].strip().lower() == "cpu" else d

    @property
    def description(self) -> Description:
        """What the run is (ddp_lab.folder.description): the one source
        of its series label (labels that differ are never repeats)."""
        return describe_run(self.config, self.summary)

    @property
    def scaling(self) -> str:
        """strong (train.global_batch fixed) | weak (batch per rank fixed):
        summary.json's, else strong where the config's global_batch > 0."""
        s = self.summary.get("scaling")
        if s in ("strong", "weak"):
            return s
        return "strong" if int(self.cfg("train").get("global_batch") or 0) > 0 else "weak"

    @property
    def global_batch(self) -> Optional[int]:
        """Samples of one step over all ranks: summary.json's, the config's, or batch x world."""
        g = self.summary.get("global_batch") or self.cfg("train").get("global_batch")
        if g:
            return int(g)
        batch = self.summary.get("batch_size") or self.cfg("train").get("batch_size")
        return int(batch) * (self.world_size or 1) if batch else None

    @property
    def batch_per_rank(self) -> Optional[float]:
        """Samples per rank per step: global batch / world when strong, else the batch size."""
        if self.scaling == "strong" and self.global_batch:
            return self.global_batch / (self.world_size or 1)
        b = self.summary.get("batch_size") or self.cfg("train").get("batch_size")
        return float(b) if b else None

    @property
    def fingerprint(self) -> dict:
        return self.summary.get("fingerprint") or {}

    @property
    def fingerprint_id(self) -> str:
        """summary.json `fingerprint_id`; "?" for a run before them."""
        return self.summary.get("fingerprint_id") or "?"

    @property
    def workload(self) -> tuple:
        """What must match for epoch times to compare across worlds:
        model, optimiser, scaling and its batch (per rank when weak),
        micro-batch, step cap (0: the whole shard), epochs, pipeline."""
        train, s = self.cfg("train"), self.summary
        batch = self.global_batch if self.scaling == "strong" else train.get("batch_size", s.get("batch_size"))
        return (self.cfg("model").get("name", s.get("model")), self.cfg("optim").get("name", s.get("optim")),
                self.scaling, batch, int(train.get("micro_batch") or 0),
                train.get("max_steps_per_epoch", 0), self.get("epochs"),
                self.cfg("data").get("pipeline", s.get("pipeline")))

    def workload_label(self, epochs: bool = True) -> str:
        """e.g. "mlp, adam, global batch 64 (strong scaling), 20
        steps/epoch, 2 epochs"; the epochs left out unless `epochs`."""
        model, optim, scaling, batch, micro, steps, n_epochs, pipeline = self.workload
        epochs = n_epochs if epochs else None
        what = (f"global batch {batch} (strong scaling)" if scaling == "strong"
                else f"batch {batch}/rank (weak scaling)")
        return ", ".join(str(p) for p in (
            model, optim, what, f"micro {micro}" if micro else None,
            f"{steps} steps/epoch" if steps else "full epochs",
            plural(epochs, "epoch") if epochs else None,
            f"{pipeline} pipeline" if pipeline else None) if p)

    def workload_short(self) -> str:
        """A panel title: "mlp, batch 64/rank, 100 steps/epoch"."""
        model, _, scaling, batch, _, steps, _, _ = self.workload
        what = f"global batch {batch}" if scaling == "strong" else f"batch {batch}/rank"
        return f"{model}, {what}, " + (f"{steps} steps/epoch" if steps else "full epochs")

    def timed_records(self) -> list[EpochRecord]:
        """The timed epochs in order; one split by a resume spans two allocations: left out."""
        return sorted((r for r in self.records if r.epoch_time_s and not r.resumed_at_step),
                      key=lambda r: r.epoch)

    def epoch_time_values(self, warmup: Optional[int] = None) -> tuple[list[float], int]:
        """Epoch times (s) after the warm-up (the first `warmup` epochs,
        by default 1, where the run timed more), and the epochs excluded."""
        times = [float(r.epoch_time_s) for r in self.timed_records()]
        if not times:
            t = self.summary.get("epoch_time_s_mean") or self.summary.get("epoch_time_s_median")
            return ([float(t)] if t else []), 0
        skip = (1 if len(times) > 1 else 0) if warmup is None else warmup
        # too few epochs to drop any: every one counts (as reported)
        skip = 0 if skip >= len(times) else skip
        return times[skip:], skip

    def epoch_samples(self) -> Optional[float]:
        """Samples of one epoch over all ranks (mean over the epochs logged); None when unknown."""
        steps = [r.steps for r in self.records if r.steps]
        if not steps or not self.batch_per_rank:
            return None
        return sum(steps) / len(steps) * self.batch_per_rank * (self.world_size or 1)

    def samples_per_s(self) -> Optional[float]:
        """Median of metrics.jsonl `samples_per_s` over the epochs."""
        values = [r.samples_per_s for r in self.records if r.samples_per_s is not None]
        return statistics.median(values) if values else None

    def steps_total(self, records: Optional[list[EpochRecord]] = None) -> int:
        return sum(int(r.steps or 0) for r in (self.records if records is None else records))

    def phase_ms(self) -> dict[str, Optional[float]]:
        """Mean ms per step of each phase and the step, over all epochs."""
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

    def comm_per_step(self, records: Optional[list[EpochRecord]] = None) -> dict:
        """Measured comm per step of `records` (default: all): seconds, payload bytes, calls."""
        records = self.records if records is None else records
        steps = self.steps_total(records)
        keys = ("time_s", "payload_bytes", "calls")
        if not steps:
            return dict.fromkeys(keys)
        return {k: sum(float((r.comm or {}).get(k) or 0.0) for r in records) / steps for k in keys}


# Finding and reading run folders, complete or not.

MARKERS = ("config.yaml", "summary.json", "metrics.jsonl")
# a study folder (ddp_lab.command.study): its run folders are in points/
STUDY_FILE = "study.json"


class ReportError(Exception):
    """A mistake in the report's input: one line, no traceback."""


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
    """The epoch records, and how many lines were torn or not one."""
    lines, torn = read_metrics(path)
    records: list[EpochRecord] = []
    for line in lines:
        with contextlib.suppress(ValueError):
            records.append(EpochRecord.from_dict(line))
    return records, len(torn) + len(lines) - len(records)


def load_run(path: Path) -> Run:
    """Read one run folder and decide whether it can be compared, and if not, why."""
    config = _read_config(path / "config.yaml") if (path / "config.yaml").exists() else {}
    summary, err = _read_json(path / "summary.json") if (path / "summary.json").exists() else ({}, None)
    summary = summary or {}
    dry = bool((config.get("launcher") or {}).get("dry_run"))
    if "bench" in config or summary.get("kind") == "bench" or (path / "bench.json").exists():
        return _load_bench(path, config, summary, err, dry)
    records, bad = _read_records(path / "metrics.jsonl")
    typed = RunSummary.from_dict(summary) if summary else None
    run = Run(path, "train", False, "", typed.to_dict() if typed else {}, config, records)
    if err:
        run.status = err
    elif not summary:
        run.status = ("dry run: nothing was started" if dry else
                      f"incomplete: {len(records)} of {run.get('epochs')} epoch(s) logged and no "
                      "summary.json (still running, or killed)" if records else
                      "incomplete: no summary.json, no metrics (never started, still running, or killed)")
    elif typed.records_kept is False:
        # a run.entry of its own (ddp_lab.rank.one_file)
        run.status = (f"{typed.status}: run.entry={typed.entry} keeps no records (no metrics.jsonl), "
                      "so it has no figures to compare")
    elif typed.status != "completed":
        run.status = str(typed.status or "no status in summary.json")
    elif typed.epoch_time_s_median is None:
        run.status = "completed but no epoch was timed (a resumed run that had already finished)"
    else:
        run.ok = True
        run.status = f"completed ({bad} unreadable metrics line(s) ignored)" if bad else "completed"
    return run


def _load_bench(path: Path, config: dict, summary: dict, err: Optional[str], dry: bool) -> Run:
    run = Run(path, "bench", False, "", summary, config)
    status = str(summary.get("status") or "no status in summary.json")
    if err or not summary:
        run.status = err or ("dry run: nothing was started" if dry else
                             "incomplete: no summary.json (still running, or killed)")
    elif not status.startswith("completed"):
        run.status = status
    elif not (path / "bench.json").exists():
        run.status = "bench.json is missing"
    else:
        doc, why = _read_json(path / "bench.json")
        run.bench, run.ok, run.status = doc, doc is not None, why or status
    return run


def usable(runs: list[Run], kind: str = "train") -> list[Run]:
    """The runs of `kind` the report can compare."""
    return [r for r in runs if r.kind == kind and r.ok]


def find_runs(paths: list[str | Path], exclude: Optional[Path] = None) -> list[Run]:
    """Every run folder at or under `paths` (a list of folders), each once, sorted by path."""
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
            # a study folder: its points are runs, it is not
            study = STUDY_FILE in filenames
            if exclude is not None and here == exclude and here != root:
                # our own output
                dirnames[:] = []
            elif not study and DRY_RUN in filenames and is_dry_run(here):
                # rendered, never started
                dry += 1
                dirnames[:] = []
            elif not study and any(m in filenames for m in MARKERS):
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
