"""The entry every rank of a training run runs: `python -m ddp_lab.worker RUN_DIR`.

It reads the run folder's resolved config.yaml (it never composes one of its own), finds
its place in the world from the launcher's variables (ddp_lab.rank.main.run_rank), and trains.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ddp_lab.config import load_run_config
from ddp_lab.rank.main import rank_main, run_rank


def run(run_dir: Path) -> int:
    from ddp_lab.train import train

    cfg = load_run_config(run_dir)
    return run_rank(run_dir, cfg, lambda ctx: train(cfg, ctx, run_dir), cfg.train.threads)


def main(argv: list[str] | None = None) -> int:
    return rank_main(argv, "ddp_lab.worker", "python -m ddp_lab", run)


if __name__ == "__main__":
    sys.exit(main())
