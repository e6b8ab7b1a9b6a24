"""Where numbers go: metrics.jsonl, summary.json, TensorBoard, the per-rank logs. Only one
rank writes results.

`make_sink(run_dir, enabled)` gives the logging rank a `RunFolderSink` and every other rank
a `NullSink` that does nothing, so the caller (`ddp_lab.telemetry`) never asks which rank
it is on (torchtitan's habit). TensorBoard tags carry their units: `time/epoch(s)`,
`throughput/train(samples/s)`, `comm/busbw(GB/s)`.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Optional

from .env import DistEnv
from .files import atomic_write_text, write_json
from .records import EpochRecord, RunSummary


class RankFormatter(logging.Formatter):
    def __init__(self, rank: int):
        super().__init__(f"[rank {rank}] %(message)s")


def setup_logging(env: DistEnv, run_dir: Optional[Path], level: str = "INFO") -> logging.Logger:
    """Every rank logs to run_dir/logs/rank<N>.log; only rank 0 (and errors) to the console."""
    log = logging.getLogger("ddp_lab")
    log.handlers.clear()
    log.setLevel(logging.DEBUG)
    log.propagate = False
    fmt = RankFormatter(env.rank)
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(fmt)
    console.setLevel(getattr(logging, level.upper(), logging.INFO) if env.rank == 0 else logging.ERROR)
    log.addHandler(console)
    if run_dir is not None:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(run_dir / "logs" / f"rank{env.rank}.log")
        fh.setFormatter(logging.Formatter(f"%(asctime)s [rank {env.rank}] %(levelname)s %(message)s"))
        fh.setLevel(logging.DEBUG)
        log.addHandler(fh)
    return log


class NullSink:
    """What a non-logging rank writes to: nothing. The loop and `Telemetry` call it exactly
    as the real one, so no `if rank == 0` sits around each call (torchtitan's BaseLogger)."""

    def truncate_after(self, epoch: int) -> None:
        pass

    def text(self, tag: str, text: str) -> None:
        pass

    def epoch(self, record: EpochRecord, scalars: dict[str, float]) -> None:
        pass

    def steps(self, points: list[tuple[int, dict[str, float]]]) -> None:
        pass

    def summary(self, summary: RunSummary) -> None:
        pass

    def close(self, hparams: Optional[dict] = None, final: Optional[dict] = None) -> None:
        pass


class RunFolderSink(NullSink):
    """metrics.jsonl, summary.json and TensorBoard of one run folder. Both JSON files are
    rewritten whole and atomically (`ddp_lab.files`): a reader, or a run killed mid-write,
    sees the file before or after an epoch, never a torn line. They are small (a line per
    epoch), so the rewrite costs nothing next to an epoch."""

    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = run_dir
        self.metrics = run_dir / "metrics.jsonl"
        self._lines: list[str] = []
        self.tb: Optional[SummaryWriter] = SummaryWriter(log_dir=str(run_dir / "tb"))

    def truncate_after(self, epoch: int) -> None:
        """On resume: keep the records up to the checkpoint we continue from, drop later
        ones (a fresh run keeps none)."""
        lines = self.metrics.read_text().splitlines() if self.metrics.exists() else []
        self._lines = [ln for ln in lines if ln.strip() and json.loads(ln).get("epoch", 0) <= epoch]
        if self.metrics.exists():
            self._write_metrics()

    def _write_metrics(self) -> None:
        atomic_write_text(self.metrics, "".join(ln + "\n" for ln in self._lines))

    def text(self, tag: str, text: str) -> None:
        self.tb.add_text(tag, text)

    def epoch(self, record: EpochRecord, scalars: dict[str, float]) -> None:
        self._lines.append(json.dumps(record.to_dict(), sort_keys=True))
        self._write_metrics()
        for tag, value in scalars.items():
            self.tb.add_scalar(tag, value, record.epoch)
        self.tb.flush()

    def steps(self, points: list[tuple[int, dict[str, float]]]) -> None:
        """Per-step scalars, written in one go at the end of an epoch (x axis: global step)."""
        for step, scalars in points:
            for tag, value in scalars.items():
                self.tb.add_scalar(tag, value, step)
        self.tb.flush()

    def summary(self, summary: RunSummary) -> None:
        write_json(self.run_dir / "summary.json", summary.to_dict())

    def close(self, hparams: Optional[dict] = None, final: Optional[dict] = None) -> None:
        if self.tb is None:
            return
        if hparams is not None and final:
            # run_name="." keeps the hparams record beside the scalars of this run
            self.tb.add_hparams(hparams, final, run_name=".")
        self.tb.close()
        self.tb = None


def make_sink(run_dir: Path, enabled: bool) -> NullSink:
    """The run folder's sink on the logging rank, the no-op one elsewhere."""
    return RunFolderSink(run_dir) if enabled else NullSink()
