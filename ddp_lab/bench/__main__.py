"""`python -m ddp_lab.bench [overrides]`: compose the config once, make the run folder, launch.

    python -m ddp_lab.bench                                   # all_reduce, 2^10..2^26, all ranks
    python -m ddp_lab.bench bench.impl=[torch,ring,butterfly] launcher.nproc_per_node=4
    python -m ddp_lab.bench bench=handin                      # the assignment's hand-in plot
    python -m ddp_lab.bench launcher.dry_run=true             # print what would run
"""

from .. import config
from ..command.cli import cli
from . import config as bench_config
from .submit import resolve_bench, submit_bench

if __name__ == "__main__":
    bench_config.register_bench_configs()
    cli("bench", submit_bench, resolve_bench, schemas=(config, bench_config))
