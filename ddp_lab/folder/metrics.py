"""Where numbers go: metrics.jsonl, summary.json, TensorBoard, the per-rank logs.
`make_sink(run_dir, enabled)` gives the logging rank a `RunFolderSink` and every other a
`NullSink`, so the caller never asks which rank it is on.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Callable, Optional

from ..world.env import DistEnv
from .files import DISK_FULL, atomic_write_text, disk_error, write_json
from .records import EpochRecord, RunSummary, read_metrics
from .tensorboard import TensorBoardRun, drop_head, run_folder, write_head, written_folders


class _LogFile(logging.FileHandler):
    """A rank's log file. A full disk costs the log (said once on the console), not the run: the
    checkpoint, whose write fails next, is what ends it, in its own words."""

    def __init__(self, path: Path, rank: int):
        super().__init__(path)
        self.rank, self.said = rank, False

    def handleError(self, record: logging.LogRecord) -> None:
        full = disk_error(sys.exc_info()[1])
        if full is None:
            return super().handleError(record)
        if not self.said:
            self.said = True
            print(f"[rank {self.rank}] cannot write its log {self.baseFilename}: "
                  f"{DISK_FULL[full.errno]}", file=sys.stderr, flush=True)


def setup_logging(env: DistEnv, run_dir: Optional[Path], level: str = "INFO",
                  every_rank: bool = False) -> logging.Logger:
    """Every rank logs to run_dir/logs/rank<N>.log, rank 0 (every rank with `every_rank`) also to
    the console (faulthandler's stacks go there too: ddp_lab/rank/main.py, `stacks_into`)."""
    log = logging.getLogger("ddp_lab")
    log.handlers.clear()
    log.setLevel(logging.DEBUG)
    log.propagate = False
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(logging.Formatter(f"[rank {env.rank}] %(message)s"))
    shown = env.rank == 0 or every_rank
    console.setLevel(getattr(logging, level.upper(), logging.INFO) if shown else logging.ERROR)
    log.addHandler(console)
    if run_dir is not None:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        fh = _LogFile(run_dir / "logs" / f"rank{env.rank}.log", env.rank)
        fh.setFormatter(logging.Formatter(f"%(asctime)s [rank {env.rank}] %(levelname)s %(message)s"))
        fh.setLevel(logging.DEBUG)
        log.addHandler(fh)
    return log


class NullSink:
    """What a non-logging rank writes to: nothing, called as the real one (`RunFolderSink`): every
    method but `truncate_after`, which keeps no record, does nothing."""

    def truncate_after(self, epoch: int, global_step: int = 0) -> list[dict]:
        return []

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("__"):  # copy's and pickle's probes are no methods of it
            raise AttributeError(name)
        return lambda *args, **kwargs: None


class RunFolderSink:
    """metrics.jsonl, summary.json and TensorBoard of one run folder; the JSON files rewritten
    whole and atomically: never a torn line."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.metrics = run_dir / "metrics.jsonl"
        self._lines: list[str] = []
        self._tb: Optional[TensorBoardRun] = None
        self._at = 0  # global steps done at the checkpoint the run continues from

    def truncate_after(self, epoch: int, global_step: int = 0) -> list[dict]:
        """Keep (and return) the records up to the checkpoint we continue from, drop the rest; so
        does TensorBoard (`global_step`)."""
        records, torn = read_metrics(self.metrics)
        if torn:  # torn by something outside the run: kept aside, said once
            aside = self.metrics.with_name(self.metrics.name + ".torn")
            with open(aside, "a") as f:
                f.writelines(line + "\n" for _, line in torn)
            logging.getLogger("ddp_lab").warning(
                "%s: %d line(s) that are not JSON records (torn?), line %s first: moved to %s",
                self.metrics.name, len(torn), torn[0][0], aside.name)
        kept = [r for r in records if r.get("epoch", 0) <= epoch]
        self._lines = [json.dumps(r, sort_keys=True) for r in kept]
        if self.metrics.exists():
            self._write_metrics()
        self._at = global_step
        return kept

    def tensorboard(self, name: str, config: str, hparams: dict,
                    bands: tuple[str, ...] = ("step", "epoch"), load: tuple[str, str] = ("?", "?"),
                    steps_per_epoch: int = 0) -> None:
        """Open the run's TensorBoard folder: a former segment's, its points past the checkpoint
        hidden and its head replaced (`write_head`), else a fresh tb/<name>."""
        tb = self.run_dir / "tb"
        if not self._at:
            TensorBoardRun.clear(tb)
        written = bool(written_folders(tb))
        if written:
            drop_head(run_folder(tb, name))
        self._tb = TensorBoardRun(tb, name, purge_step=self._at + 1 if written else None,
                                  load=load, steps_per_epoch=steps_per_epoch)
        write_head(self._tb, config, hparams, bands, fresh=not written)

    def _write_metrics(self) -> None:
        atomic_write_text(self.metrics, "".join(ln + "\n" for ln in self._lines))

    def epoch(self, record: EpochRecord, scalars: dict[str, float], step: int) -> None:
        """An epoch's record, and its scalars at `step` (the global steps done)."""
        self._lines.append(json.dumps(record.to_dict(), sort_keys=True))
        self._write_metrics()
        self._tb.scalars(step, scalars)
        self._tb.epoch(record.epoch, scalars)
        self._tb.writer.flush()  # the epoch's end: outside every step's clock

    def steps(self, points: list[tuple[int, dict[str, float]]]) -> None:
        """Per-step scalars (step, values); the writer's thread flushes them."""
        for step, scalars in points:
            self._tb.scalars(step, scalars)

    def summary(self, summary: RunSummary) -> None:
        """summary.json, rewritten whole."""
        write_json(self.run_dir / "summary.json", summary.to_dict())

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def make_sink(run_dir: Path, enabled: bool) -> RunFolderSink | NullSink:
    """The run folder's sink on the logging rank, the no-op one elsewhere."""
    return RunFolderSink(run_dir) if enabled else NullSink()
