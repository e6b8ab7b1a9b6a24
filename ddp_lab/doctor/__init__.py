"""`python -m ddp_lab.doctor [overrides]`: the allocation checked before a run (docs/doctor.md).

The run's launcher settings start one short job through the run's launcher machinery
(`ddp_lab.command.job.launch_job`), every rank running `ddp_lab.doctor.probe`: what it sees, then
an all-reduce timed within each node and across nodes. `submit` turns the folder's facts into one
verdict line per check (`verdicts`) and keeps them in `doctor.json` (ddp_lab.folder.doctor, which
a run and the report read).

Layers: `verdicts` imports no torch and nothing of the ranks; `submit` imports the submitting
side's machinery (command/, launch/) only (pyproject.toml's import-linter contract); `probe` is
the ranks' side.
"""
