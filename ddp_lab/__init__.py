"""ddp_lab: learn, run and measure data-parallel training with PyTorch.

The lesson sits at the top of the package (docs/tour.md reads it in order): `train`
(the step), `models`, `data`, `sync/` (the synchronisers), `collectives/` (the ring, tree
and butterfly from send/recv), `timing/` (how each phase and each collective is timed),
`distributed`, `env` and `topology` (how a rank finds its world), `config` (every key).
Around it: `launch/` (torchrun, mpirun, SLURM, RunAI), `run/` (run folder, stop, resume,
status), `measure/` with `bench/` and `report/` (the cost model, the bench, the report).
Entry points: `python -m ddp_lab`, `.bench`, `.report`, `.status`, `.nccl_env`.
"""

__version__ = "0.1.0"
