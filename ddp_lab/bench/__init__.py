"""Collective benchmarks: `python -m ddp_lab.bench [overrides]` (docs/bench.md).

    python -m ddp_lab.bench                                   # all_reduce sweep, this machine
    python -m ddp_lab.bench bench.impl=[torch,ring,butterfly,tree,linear]   # ours vs the library

The same path as a training run: the run folder, the launcher, and on every rank `python -m
ddp_lab.bench.worker RUN_DIR`. The training benchmarks (`python -m ddp_lab.bench.suite NAME`:
suite.py, specs/, scaffold.py) are apart.
"""
