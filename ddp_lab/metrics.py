"""Where numbers go: metrics.jsonl, TensorBoard, the console. Only one rank writes.

`MetricsWriter(run_dir, enabled=False)` is a no-op, so the training loop calls it on every
rank without `if rank == 0` around each call (torchtitan's habit). TensorBoard tags carry
their units: `time/epoch(s)`, `throughput/train(samples/s)`, `comm/busbw(GB/s)`.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Optional

from .env import DistEnv
from .files import atomic_write_text, write_json  # noqa: F401 -- write_json re-exported


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


class MetricsWriter:
    def __init__(self, run_dir: Path, enabled: bool):
        self.enabled = enabled
        self.run_dir = run_dir
        self.tb = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(run_dir / "tb"))

    def truncate_after(self, epoch: int) -> None:
        """On resume: drop records of epochs after the checkpoint we continue from."""
        path = self.run_dir / "metrics.jsonl"
        if not self.enabled or not path.exists():
            return
        keep = [ln for ln in path.read_text().splitlines()
                if ln.strip() and json.loads(ln).get("epoch", 0) <= epoch]
        atomic_write_text(path, "".join(k + "\n" for k in keep))

    def text(self, tag: str, text: str) -> None:
        if self.tb:
            self.tb.add_text(tag, text)

    def epoch(self, record: dict, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
        for tag, value in scalars.items():
            self.tb.add_scalar(tag, value, record["epoch"])
        self.tb.flush()

    def steps(self, points: list[tuple[int, dict[str, float]]]) -> None:
        """Per-step scalars, written in one go at the end of an epoch (x axis: global step)."""
        if not self.enabled:
            return
        for step, scalars in points:
            for tag, value in scalars.items():
                self.tb.add_scalar(tag, value, step)
        self.tb.flush()

    def close(self, hparams: Optional[dict] = None, final: Optional[dict] = None) -> None:
        if not self.tb:
            return
        if hparams is not None and final:
            # run_name="." keeps the hparams record beside the scalars of this run
            self.tb.add_hparams(hparams, final, run_name=".")
        self.tb.close()
        self.tb = None
