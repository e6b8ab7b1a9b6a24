"""The entry every rank runs: `python -m ddp_lab.worker RUN_DIR`.

It reads the run folder's resolved config.yaml (it never composes one of its own), finds
its place in the world from the launcher's variables, and trains. `run_rank` is the part
every rank entry shares (the benchmark's too): env, logging, threads, the process group,
and a failure turned into a log line and a `failed` summary instead of a traceback.
"""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

from .config import load_run_config
from .distributed import DistContext, cpu_threads, distributed
from .env import detect_env
from .metrics import setup_logging, write_json


def run_rank(run_dir: Path, cfg: Any, body: Callable[[DistContext], None], threads: int = 0,
             failure: Optional[dict] = None) -> int:
    """Run `body` on this rank inside an initialised process group; 0 on success, 1 after
    logging the failure (rank 0 also writes it to summary.json with `failure`'s fields)."""
    import torch

    env = detect_env()
    log = setup_logging(env, run_dir, cfg.log.level)
    torch.set_num_threads(cpu_threads(env, threads))
    try:
        with distributed(env, cfg.dist.backend, cfg.dist.device, cfg.dist.timeout_s) as ctx:
            body(ctx)
        return 0
    except Exception as e:  # noqa: BLE001 -- the log keeps the trace, the console the reason
        log.debug(traceback.format_exc())
        log.error("failed: %s: %s (traceback in %s)", type(e).__name__, e,
                  run_dir / "logs" / f"rank{env.rank}.log")
        if env.is_main:
            write_json(run_dir / "summary.json", {
                **(failure or {}), "status": f"failed: {type(e).__name__}: {e}",
                "world_size": env.world_size})
        return 1
    finally:
        logging.shutdown()


def rank_main(argv: Optional[list[str]], module: str, maker: str,
              run: Callable[[Path], int]) -> int:
    """`python -m <module> RUN_DIR`: check the argument, then run."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not (Path(argv[0]) / "config.yaml").is_file():
        print(f"usage: python -m {module} RUN_DIR  (a folder holding config.yaml, "
              f"as `{maker}` makes)", file=sys.stderr)
        return 2
    return run(Path(argv[0]).resolve())


def run(run_dir: Path) -> int:
    from .train import train

    cfg = load_run_config(run_dir)
    return run_rank(run_dir, cfg, lambda ctx: train(cfg, ctx, run_dir), cfg.train.threads)


def main(argv: list[str] | None = None) -> int:
    return rank_main(argv, "ddp_lab.worker", "python -m ddp_lab", run)


if __name__ == "__main__":
    sys.exit(main())
