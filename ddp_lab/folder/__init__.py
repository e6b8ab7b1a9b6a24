"""The run folder: what every side reads and writes.

`rundir` (make or reuse it), `files` (atomic writes), `records` and `metrics`
(summary.json, metrics.jsonl), `names` (what a run is called), `tensorboard` (tb/),
`checkpoint` (what a checkpoint holds), `progress` (each rank's progress record).
"""
