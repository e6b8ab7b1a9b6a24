"""One rank of a rendered run under cProfile: python scripts/profile_rank.py RUN_DIR OUT.prof

RUN_DIR is a folder `python -m ddp_lab launcher.dry_run=true launcher.nproc_per_node=1 ...`
rendered; the rank runs in this process (world 1, its variables set here) and its profile
goes to OUT.prof for scripts/profile_diff.py. (`python -m cProfile -m ddp_lab.worker` writes
nothing: the worker leaves with os._exit, skipping the interpreter's teardown.)
"""

import cProfile
import os
import sys
from pathlib import Path


def rank_here(run_dir: str):
    """RUN_DIR's rank 0 of a world of 1, to be run in this process: the worker's `run`
    (not its main, which leaves with os._exit) and its argument."""
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("MASTER_PORT", "29641"))
    from ddp_lab.world import cpu

    cpu.prepare_rank()  # before torch loads: libgomp reads its variables once
    from ddp_lab.worker import run

    return run, Path(run_dir).resolve()


if __name__ == "__main__":
    run, folder = rank_here(sys.argv[1])
    profiler = cProfile.Profile()
    rc = profiler.runcall(run, folder)
    profiler.dump_stats(sys.argv[2])
    print(f"rank exit {rc}; profile in {sys.argv[2]}")
