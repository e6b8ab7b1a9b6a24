"""`python -m ddp_lab.doctor [overrides]`: the allocation checked before a run (docs/doctor.md):
`submit` starts one short job through the run's launcher machinery, every rank running `probe`,
and turns the folder's facts into one verdict line per check (`verdicts`), kept in `doctor.json`.

Layers: `verdicts` imports no torch and nothing of the ranks; `submit` imports the submitting
side's machinery (command/, launch/) only (pyproject.toml's import-linter contract); `probe` is
the ranks' side.
"""
