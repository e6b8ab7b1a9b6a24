"""The submitting command: what runs on the machine where a user types
`python -m ddp_lab`.

- `cli` (Hydra's entry), `mistakes` (a mistake said in one line),
  `sweep_table` (a sweep's closing table);
- `validate` (the rule tables, run before any process starts) and its
  rules: `config_rules`, `folder_rules`, `machine_rules`, `train_rules`;
- `submit` (one run, a sweep or a study), `job` (the launcher's side of
  a run), `lock` (one command per run folder), `paste` (the commands
  printed to paste);
- `status` (a run's state), `status_commands` (`python -m
  ddp_lab.status`), with `status_screen` (show it), `status_follow`
  (follow it), `status_stop` (stop it);
- `study`, `study_plan`, `study_folder`: a scaling study, one run per
  world size.
"""
