"""The entry every rank of a training run runs:
`python -m ddp_lab.worker RUN_DIR`.

It reads the run folder's resolved config.yaml (it never composes one
of its own), finds its place in the world from the launcher's
variables (`run_rank`), and runs the lesson's loop (`train`) with the
run's machinery around it (`run_training`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ddp_lab.config import load_run_config
from ddp_lab.rank.main import rank_main, run_rank, run_training


def run(run_dir: Path) -> int:
    # torch loads here, on the rank (rank_main prepared the CPU first)
    from ddp_lab.train import train

    cfg = load_run_config(run_dir)
    return run_rank(run_dir, cfg,
                    lambda ctx: run_training(train, cfg, ctx, run_dir),
                    cfg.train.threads)


def main(argv: list[str] | None = None) -> int:
    return rank_main(argv, "ddp_lab.worker", "python -m ddp_lab", run)


if __name__ == "__main__":
    sys.exit(main())
