"""Collective benchmarks: `python -m ddp_lab.bench [overrides]` (docs/bench.md).

    python -m ddp_lab.bench                                   # all_reduce sweep, this machine
    python -m ddp_lab.bench bench.ops=[all_reduce,reduce_broadcast,send_recv_ring,all_gather,reduce_scatter]
    python -m ddp_lab.bench bench.impl=[torch,ring,butterfly,tree,naive]   # ours vs the library
    python -m ddp_lab.bench bench=handin launcher=slurm launcher.nodes=4 launcher.nproc_per_node=4

The same path as a training run: the run folder, the launcher, and on every rank
`python -m ddp_lab.bench.worker RUN_DIR`; rank 0 writes bench.csv, bench.json, bench.md
and plots/. The training benchmarks (`python -m ddp_lab.bench.suite NAME`: suite.py,
specs/, scaffold.py) are apart; this benchmark imports none of them.
"""
