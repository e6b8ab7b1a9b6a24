"""`python -m ddp_lab.doctor [overrides]`: the allocation checked before
a run (docs/doctor.md).

The same launcher settings as a run start one short job through the same
launcher machinery (`ddp_lab.command.job.launch_job`), every rank
running `ddp_lab.doctor.probe`: each writes what it sees (its facts:
software, data, cores, GPUs, the scheduler's counts, the interface its
collectives would use and that link), then the ranks join a process
group and time an all-reduce within each node and across nodes
(probe.py's `_measure`). The submitting side (`submit`) turns the
folder's facts into one verdict line per check (`verdicts`, pure: the
checks of placement, nodes and network, and the parsers of NVIDIA's
tools' output) and keeps them in `doctor.json` (ddp_lab.folder.doctor,
which a run and the report read).

Layers: `verdicts` imports no torch and nothing of the ranks; `submit`
imports the submitting side's machinery (command/, launch/) only
(pyproject.toml's import-linter contract); `probe` is the ranks' side.
"""
