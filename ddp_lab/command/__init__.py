"""The submitting command: what runs on the machine where a user types `python -m ddp_lab`.

- `cli` (Hydra's entry and a sweep's closing table), `mistakes` (a mistake said in one line);
- `validate` (every rule, in tables, run before any process starts);
- `submit` (one run, a sweep or a study), `job` (the launcher's side of a run), `lock` (one command
  per run folder), `paste` (the commands printed to paste);
- `status` (a run's state and its screen; the command `python -m ddp_lab.status` is
  ddp_lab/status.py);
- `study`: a scaling study, one run per world size.
"""
