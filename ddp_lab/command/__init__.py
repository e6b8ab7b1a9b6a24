"""The submitting command: what runs on the machine where a user types `python -m ddp_lab`.

- `cli` (Hydra's entry), `mistakes` (a mistake as one line), `sweep_table`
  (a sweep's closing table), `validate` (every rule before any process
  starts), `submit` (one run, a sweep or a study), `job` (the launcher's side of a run),
  `lock` (one command per run folder);
- `status` (a run's state), `status_commands` (`python -m ddp_lab.status`: show it,
  follow it, stop it);
- `study`, `study_plan`, `study_folder`: a scaling study, one run per world size.
"""
