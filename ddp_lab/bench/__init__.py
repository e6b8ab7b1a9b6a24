"""Collective benchmarks: `python -m ddp_lab.bench [overrides]`.

    python -m ddp_lab.bench                                   # all_reduce sweep, this machine
    python -m ddp_lab.bench bench.ops=[all_reduce,reduce_broadcast,send_recv_ring,all_gather,reduce_scatter]
    python -m ddp_lab.bench bench.impl=[torch,ring,butterfly,tree,naive]   # ours vs the library
    python -m ddp_lab.bench bench=handin launcher=slurm launcher.nodes=4 launcher.nproc_per_node=4

The same path as a training run: Hydra composes `conf/bench.yaml` once, the run folder
is made, the launcher renders and starts the job, and every rank runs
`python -m ddp_lab.bench.worker RUN_DIR` (the config's `run.entry`). Rank 0 writes
bench.csv, bench.json, bench.md and plots/ into the run folder. See docs/bench.md.

The training benchmarks are apart: `python -m ddp_lab.bench.suite NAME` (suite.py, one
runner; specs/, one module per benchmark; scaffold.py, the trainer's parts on a local gloo
group). This benchmark imports none of them.
"""
