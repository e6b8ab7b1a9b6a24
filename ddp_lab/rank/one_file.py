"""`python -m ddp_lab run.entry=ddp_lab.rank.one_file sync=ring`:
ddp_lab's launchers run stop 0, the one-file lesson.

Every rank runs `python -m ddp_lab.rank.one_file RUN_DIR`. The lesson takes flags and reads no run
folder, so this reads the folder's config.yaml and calls the lesson's `main` with the same settings
as flags; rank 0 writes the final weights to the folder's model.pt. No metrics, summary or
checkpoints: the command that launched it writes the summary from its exit status.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .. import one_file
from ..config import load_run_config
from ..world import torch_support


def flags(run_dir: Path) -> list[str]:
    """The lesson's flags that train as the run's config says."""
    cfg = load_run_config(run_dir)
    train = cfg.train
    sync = cfg.sync.name
    if sync not in one_file.SYNCS:
        sys.exit(f"sync={sync}: stop 0 has sync=naive and sync=ring")
    # what optim.fused=null picks for the CPU the lesson runs on
    fused = torch_support.fused("adam", "cpu", cfg.optim.fused)
    return ["--sync", sync,
            "--seed", str(train.seed),
            "--lr", repr(float(train.lr)),
            "--batch-size", str(train.batch_size),
            "--epochs", str(train.epochs),
            "--max-steps", str(train.max_steps_per_epoch or 0),
            "--fused" if fused else "--no-fused",
            "--save", str(run_dir / "model.pt")]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.exit("usage: python -m ddp_lab.rank.one_file RUN_DIR")
    one_file.main(flags(Path(argv[0])))


if __name__ == "__main__":
    main()
