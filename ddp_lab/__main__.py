"""`python -m ddp_lab [overrides]`: compose the config once, make the run folder, launch.

    python -m ddp_lab                                  # MNIST, 2 ranks on CPU (1 per GPU)
    python -m ddp_lab train.epochs=1 launcher.nproc_per_node=4 model=cnn
    python -m ddp_lab launcher.dry_run=true            # print what would run, start nothing
    python -m ddp_lab -m sync=ddp optim=adam,sgd       # a sweep, one run after another
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from .config import register_configs
from .submit import UserError, submit

register_configs()
_FAILED: list[int] = []


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        rc = submit(cfg)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        rc = 2
    if rc != 0:
        _FAILED.append(rc)


if __name__ == "__main__":
    main()
    sys.exit(_FAILED[0] if len(_FAILED) == 1 else (1 if _FAILED else 0))
