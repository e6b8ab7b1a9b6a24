"""`python -m ddp_lab [overrides]`: compose the config once, make the
run folder, launch.

    python -m ddp_lab                                  # MNIST, 2 ranks on CPU (1 per GPU)
    python -m ddp_lab train.epochs=1 launcher.nproc_per_node=4 model=cnn
    python -m ddp_lab launcher.dry_run=true            # print what would run, start nothing
    python -m ddp_lab -m sync=ddp,ring optim=adam,sgd  # a sweep, one run after another
"""

from . import config
from .command.cli import cli
from .command.submit import check, submit

if __name__ == "__main__":
    config.register_configs()
    cli("config", submit, check, schemas=(config,))
