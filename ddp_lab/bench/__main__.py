"""`python -m ddp_lab.bench [overrides]`: compose the config once, make the run folder, launch.

    python -m ddp_lab.bench                                   # all_reduce, 2^10..2^26, all ranks
    python -m ddp_lab.bench bench.impl=[torch,ring,butterfly] launcher.nproc_per_node=4
    python -m ddp_lab.bench bench=handin                      # the assignment's hand-in plot
    python -m ddp_lab.bench launcher.dry_run=true             # print what would run
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from ..submit import UserError
from .config import register_bench_configs
from .submit import submit_bench

register_bench_configs()
_FAILED: list[int] = []


@hydra.main(version_base=None, config_path="../../conf", config_name="bench")
def main(cfg: DictConfig) -> None:
    try:
        rc = submit_bench(cfg)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        rc = 2
    if rc != 0:
        _FAILED.append(rc)


if __name__ == "__main__":
    main()
    sys.exit(_FAILED[0] if len(_FAILED) == 1 else (1 if _FAILED else 0))
