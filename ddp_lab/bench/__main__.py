"""`python -m ddp_lab.bench [overrides]`: compose the config once, make the run folder, launch."""

from .. import config
from ..command.cli import cli
from . import config as bench_config
from .submit import resolve_bench, submit_bench

if __name__ == "__main__":
    bench_config.register_bench_configs()
    cli("bench", submit_bench, resolve_bench, schemas=(config, bench_config))
