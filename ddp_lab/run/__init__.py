"""The run machinery: what surrounds the lesson so a run can be started, stopped, resumed
and followed. None of it is needed to read how data-parallel training works.

- a command: `cli` (Hydra's overrides, errors as one line), `validate` (every rule before
  any process starts), `submit` (one run, a sweep or a study), `job` (the launcher's side
  of a run and `rank_main`, the ranks' side);
- the run folder: `rundir` (make or reuse it), `files` (atomic writes), `records` and
  `metrics` (summary.json, metrics.jsonl), `telemetry` (TensorBoard and the epoch lines;
  `presentation`: their scalars and comm part), `epoch` (one measured epoch, handed to
  telemetry);
- stop and resume: `stop` (signals and the stop file), `checkpoint` and `checkpointer`
  (what a checkpoint holds; load/save/on_stop for train()), `progress` (each rank's
  progress record), `failure` (which rank stopped the others, in one line), `delay` (a slow
  rank on purpose);
- reattach to a run, `python -m ddp_lab.status`: `status` (its state), `status_view` (its
  screen), `status_commands` (the command, --follow, --stop).
"""
