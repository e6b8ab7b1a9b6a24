"""One training step's time at N threads with this process's OpenMP wait: what `launcher=local`
starts once per wait before the ranks (`probe_waits`, launch/torchrun.py; the waits:
ddp_lab/world/cpu.py), since libgomp reads how its threads wait once, as torch loads, and no
process can time two waits in itself.

    python -m ddp_lab.launch.wait_probe RUN_DIR THREADS WORLD   # prints a step's seconds

The step is the run's own model and optimiser on a micro-batch of its size in a world of WORLD
(random digits: a step's time does not depend on the pixels), timed as the ranks' thread probe
times it (`fast_step.step_seconds`).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from ..config import batch_plan, load_run_config
from ..fast_step import step_seconds
from ..models import build_model, build_optimizer


def main(argv: list[str]) -> None:
    run_dir, threads, world = argv[0], int(argv[1]), int(argv[2])
    cfg = load_run_config(run_dir)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    optimizer = build_optimizer(cfg.optim, model.parameters(), cfg.train.lr)
    n = batch_plan(cfg.train, world).micro
    x, y = torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,))

    def steps(k: int) -> None:
        for _ in range(k):
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            model.zero_grad(set_to_none=True)

    print(min(step_seconds(steps) for _ in range(3)))


if __name__ == "__main__":
    main(sys.argv[1:])
