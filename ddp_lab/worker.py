"""The entry every rank runs: `python -m ddp_lab.worker RUN_DIR`.

It reads the run folder's resolved config.yaml (it never composes one of its own), finds
its place in the world from the launcher's variables, and trains.
"""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path

from .config import load_run_config
from .distributed import cpu_threads, distributed
from .env import detect_env
from .metrics import setup_logging, write_json


def run(run_dir: Path) -> int:
    import torch

    from .train import train

    cfg = load_run_config(run_dir)
    env = detect_env()
    log = setup_logging(env, run_dir, cfg.log.level)
    torch.set_num_threads(cpu_threads(env, cfg.train.threads))
    try:
        with distributed(env, cfg.dist.backend, cfg.dist.device, cfg.dist.timeout_s) as ctx:
            train(cfg, ctx, run_dir)
        return 0
    except Exception as e:  # noqa: BLE001 -- the log keeps the trace, the console the reason
        log.debug(traceback.format_exc())
        log.error("failed: %s: %s (traceback in %s)", type(e).__name__, e,
                  run_dir / "logs" / f"rank{env.rank}.log")
        if env.is_main:
            write_json(run_dir / "summary.json", {"status": f"failed: {type(e).__name__}: {e}",
                                                   "world_size": env.world_size})
        return 1
    finally:
        logging.shutdown()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not (Path(argv[0]) / "config.yaml").is_file():
        print("usage: python -m ddp_lab.worker RUN_DIR  (a folder holding config.yaml, "
              "as `python -m ddp_lab` makes)", file=sys.stderr)
        return 2
    return run(Path(argv[0]).resolve())


if __name__ == "__main__":
    sys.exit(main())
