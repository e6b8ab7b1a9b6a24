"""Collective benchmarks: `python -m ddp_lab.bench [overrides]` (docs/bench.md).

    python -m ddp_lab.bench                                   # all_reduce, 2^10..2^26, all ranks
    python -m ddp_lab.bench bench.impl=[torch,ring,butterfly,tree,linear]   # ours vs the library
    python -m ddp_lab.bench bench=handin                      # the assignment's hand-in plot
    python -m ddp_lab.bench launcher.dry_run=true             # print what would run

The same path as a training run: the run folder, the launcher, and on every rank `python -m
ddp_lab.bench.worker RUN_DIR`. The training benchmarks (`python -m ddp_lab.bench.suite NAME`:
suite.py, specs/, scaffold.py) are apart.
"""
