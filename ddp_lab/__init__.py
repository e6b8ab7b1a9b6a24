"""ddp_lab: learn, run and measure data-parallel training with PyTorch.

The lesson (docs/tour.md reads it in order): `one_file` (all of it in
one file), `train` (the training run: data, model, sync, optimiser,
epochs), `step` (one epoch's steps), `models`, `data` and `data_fetch`,
`sync/` (the synchronisers), `collectives/` (the ring, tree and
butterfly from send/recv), `timing/` (how each phase and each collective
is timed).

Around it: `world/` (a rank's place in its world and what it runs on),
`rank/` (the machinery around train() on every rank), `folder/` (the run
folder), `config/` (every key), `command/` (the submitting command),
`launch/` (local, torchrun, mpirun, SLURM, RunAI), `predict/` (the cost
model), `bench/`, `check/` (a student's collectives against torch's),
`report/` and `doctor/`.

Entry points: `python -m ddp_lab`, `.bench`, `.check`, `.report`,
`.status`, `.doctor`, `.nccl_env`, and `.worker` (what every rank runs).
"""

__version__ = "0.1.0"
